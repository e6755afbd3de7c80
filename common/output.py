"""A run's output: each line an f-string, every number on it recorded by report.num(name, value, spec) as printed."""
import sys
from dataclasses import dataclass, field

from common.start import speaks

MATPLOTLIB_MISSING = "matplotlib is not installed (pip install matplotlib)"  # --plots and the page say so


def say(text=""):
    """The one way to tell the person at the terminal something: stderr (results go to stdout), once under torchrun."""
    if speaks():
        print(text, file=sys.stderr, flush=True)


# report.num's specs beside format()'s: "short", a float as Python prints it after rounding (0.1875, -0.7, 1.0; + 0.0
# turns -0.0 into 0.0); "millions", a count as the article prints ViT-B's body (85.8M; a small stand-in's in full);
# "zero or 3g", an exact zero as 0.0 (the zero head's body gradient), anything else to 3 significant digits
FORMATS = {"short": lambda x: repr(round(float(x), 4) + 0.0), "repr": repr,
           "millions": lambda value: f"{value:.1f}M" if value >= 0.1 else f"{value * 1e6:,.0f}",
           "zero or 3g": lambda value: "0.0" if value == 0 else f"{value:.3g}"}


@dataclass
class Report:
    """The printed lines of one script's run and the numbers on them, by name."""

    script: str
    quiet: bool = False  # a process other than the first under torchrun prints nothing
    numbers: dict = field(default_factory=dict)  # name -> {"value": float, "text": as printed}
    could_not_run: list = field(default_factory=list)  # (section title, the UserError: its reasons)
    lines: list = field(default_factory=list)  # every printed line, in order
    line_of: dict = field(default_factory=dict)  # name -> index in lines of the line that printed it
    series: dict = field(default_factory=dict)  # plain lists a figure needs beyond the printed numbers (maps, curves)
    passes: dict = field(default_factory=dict)  # name -> a pass over pictures: its seconds, waiting seconds, pictures

    def print(self, text=""):
        """Text as printed, framed as the article's lines are: "  " a logged line, "\n== ... ==" a section's title.
        The numbers recorded since the last text are on its last line."""
        self.lines += text.split("\n")
        self.line_of.update((name, len(self.lines) - 1) for name in self.numbers if name not in self.line_of)
        if not self.quiet:
            print(text, flush=True)

    def num(self, name, value, spec="", printed=True, right=None, of=None):
        """The number as printed with spec (a format spec, or a name of FORMATS), recorded under `name` with that
        text: the one call that records a number, inside the f-string of its line. A (nested) list, tuple or array
        prints as the article prints it, '[[7.0, 5.0], [5.0, 15.0]]' or '(197, 768)' (spec "short" unless given),
        entry (i, j) recorded as 'name[i,j]'. A pass's timing (a dict) prints as '[12 s, 0.2 s waiting for
        pictures]', its two numbers recorded as '<name> seconds' and '<name> waiting seconds'. printed=False: a number
        a conclusion reads that the article's lines do not print (the evidence for a claim of its prose), recorded on
        no line. right, of: the counts an accuracy in per cent came from, `right` of `of` pictures (right a list, one
        count a draw, for a mean over draws): --json records them, and the verdicts' exact intervals are made from
        them (common/verdicts.py)."""
        if isinstance(value, dict):  # a pass over pictures (NEW_PASS's keys), kept whole for --json
            self.passes[name] = dict(value)
            return (f"[{self.num(f'{name} seconds', value['seconds'], '.0f')} s, "
                    f"{self.num(f'{name} waiting seconds', value['waiting seconds'], '.1f')} s waiting for pictures]")
        values = value.tolist() if getattr(value, "ndim", 0) > 0 else value
        if isinstance(values, (list, tuple)):
            def entries(values, index):
                if not isinstance(values, (list, tuple)):
                    return self.num(f"{name}[{','.join(map(str, index))}]", values, spec or "short", printed)
                texts = [entries(value, index + (i,)) for i, value in enumerate(values, 1)]
                brackets = "()" if isinstance(values, tuple) else "[]"
                return brackets[0] + ", ".join(texts) + brackets[1]

            return entries(values, ())
        if name in self.numbers:
            raise ValueError(f"{self.script}: the number {name!r} is printed twice")
        text = FORMATS[spec](value) if spec in FORMATS else format(value, spec)
        counts = {} if right is None else {"right": right, "of": of, "scale": 100}
        self.numbers[name] = {"value": float(value), "text": text.strip(), **counts}
        if not printed:
            self.line_of[name] = None
        return text

    def values(self):
        """{name: value} of every number printed so far."""
        return {name: number["value"] for name, number in self.numbers.items()}

    def cannot_run(self, title, problem):
        self.print(f'  cannot run section "{title}": {problem}')
        self.could_not_run.append((title, problem))
