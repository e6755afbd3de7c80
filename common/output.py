"""A run's output: each line printed from a plain f-string, its numbers recorded beside it by name, for --json and
--compare (report.record)."""
import sys
from dataclasses import dataclass, field

from common.start_and_end import speaks

MATPLOTLIB_MISSING = "matplotlib is not installed (pip install matplotlib)"  # --plots and the page say so


def say(text=""):
    """The one way to tell the person at the terminal something: stderr (results go to stdout), once under torchrun."""
    if speaks():
        print(text, file=sys.stderr, flush=True)


def short(x):
    """A float as Python prints it after rounding to 4 places: 0.1875, -0.7, 1.0 (+ 0.0 turns -0.0 into 0.0)."""
    return repr(round(float(x), 4) + 0.0)


def listed(values, spec=None):
    """A (nested) list, tuple or array as the article prints one, '[[7.0, 5.0], [5.0, 15.0]]' or '(197, 768)', each
    entry in the format spec (default: short)."""
    values = values.tolist() if hasattr(values, "tolist") else values
    if not isinstance(values, (list, tuple)):
        return short(values) if spec is None else format(values, spec)
    brackets = "()" if isinstance(values, tuple) else "[]"
    return brackets[0] + ", ".join(listed(value, spec) for value in values) + brackets[1]


def pass_text(timing):
    """A pass over pictures (NEW_PASS's keys) as its line prints it: '[12 s, 0.2 s waiting for pictures]'."""
    return f"[{timing['seconds']:.0f} s, {timing['waiting seconds']:.1f} s waiting for pictures]"


@dataclass
class Report:
    """The printed lines of one script's run and the numbers on them, by name."""

    script: str
    quiet: bool = False  # a process other than the first under torchrun prints nothing
    numbers: dict = field(default_factory=dict)  # name -> {"value": float}, and an accuracy's counts
    could_not_run: list = field(default_factory=list)  # (section title, the UserError: its reasons)
    lines: list = field(default_factory=list)  # every printed line, in order
    series: dict = field(default_factory=dict)  # plain lists a figure needs beyond the printed numbers (maps, curves)
    passes: dict = field(default_factory=dict)  # name -> a pass over pictures: its seconds, waiting seconds, pictures

    def print(self, text=""):
        """Text as printed, framed as the article's lines are: "  " a logged line, "\n== ... ==" a section's title."""
        self.lines += text.split("\n")
        if not self.quiet:
            print(text, flush=True)

    def record(self, numbers, counts=None):
        """Each number of {name: value} kept under its name, beside the line that prints it (or, for a number a
        conclusion reads that no line prints, the evidence for a claim of the prose, on its own). A list, tuple or
        array: entry (i, j) as 'name[i,j]'. A pass over pictures (a dict, NEW_PASS's keys): kept whole, and its two
        numbers as '<name> seconds' and '<name> waiting seconds'. counts: {name: (right, of)}, the counts an accuracy
        in per cent came from, `right` of `of` pictures (right a list, one count a draw, for a mean over draws):
        --json records them, and the verdicts' exact intervals are made from them (compare/verdicts.py)."""
        counts = counts or {}
        for name, value in numbers.items():
            if isinstance(value, dict):
                self.passes[name] = dict(value)
                self.record({f"{name} seconds": value["seconds"], f"{name} waiting seconds": value["waiting seconds"]})
                continue
            values = value.tolist() if getattr(value, "ndim", 0) > 0 else value
            if isinstance(values, (list, tuple)):
                self.record(dict(entries(name, values)))
                continue
            if name in self.numbers:
                raise ValueError(f"{self.script}: the number {name!r} is recorded twice")
            right, of = counts.get(name, (None, None))
            self.numbers[name] = {"value": float(value)} | ({} if right is None else
                                                            {"right": right, "of": of, "scale": 100})

    def values(self):
        """{name: value} of every number recorded so far."""
        return {name: number["value"] for name, number in self.numbers.items()}

    def cannot_run(self, title, problem):
        self.print(f'  cannot run section "{title}": {problem}')
        self.could_not_run.append((title, problem))


def entries(name, values, index=()):
    """(name[i,j], entry) of each entry of a nested list or tuple, i and j counted from 1."""
    for i, value in enumerate(values, 1):
        if isinstance(value, (list, tuple)):
            yield from entries(name, value, (*index, i))
        else:
            yield f"{name}[{','.join(map(str, (*index, i)))}]", value
