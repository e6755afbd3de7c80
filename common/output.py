"""A run's output: each line printed from one template, every number on it recorded under its name as printed
(the templates' fields: docs/layout.md)."""
import string
import sys
from dataclasses import dataclass, field

from common.start import speaks


def short(x, digits=4):
    """A float as Python prints it after rounding: 0.1875, -0.7, 1.0."""
    return repr(round(float(x), digits) + 0.0)  # + 0.0 turns -0.0 into 0.0


def millions(value):
    """A count in millions as the article prints ViT-B's body, 85.8M; a small stand-in's count in full."""
    return f"{value:.1f}M" if value >= 0.1 else f"{value * 1e6:,.0f}"


def zero_or_3g(value):
    """An exact zero as 0.0 (the zero head's body gradient), anything else to 3 significant digits."""
    return "0.0" if value == 0 else f"{value:.3g}"


class Accuracy(float):
    """An accuracy as printed (scale 100: per cent; 1: a fraction) that keeps the counts it came from, right of `of`
    pictures (right a list, one count a draw, for a mean over draws): --json records them, and the verdicts' exact
    intervals are made from them (common/verdicts.py)."""

    def __new__(cls, right, of, scale=100, value=None):
        """value: the number as the script computed it (a mean over draws), else scale * right / of."""
        self = super().__new__(cls, scale * right / of if value is None else value)
        self.counts = {"right": right, "of": of, "scale": scale}
        return self


MATPLOTLIB_MISSING = "matplotlib is not installed (pip install matplotlib)"  # --plots and the page say so


def say(text=""):
    """The one way to tell the person at the terminal something: stderr (results go to stdout), once under torchrun."""
    if speaks():
        print(text, file=sys.stderr, flush=True)


FORMATS = {"short": short, "repr": repr, "millions": millions, "zero or 3g": zero_or_3g}  # specs beside format()'s
FIELDS = string.Formatter()  # its parse() splits a template into text and {name:spec} fields, {{ and }} undone


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
    say = staticmethod(say)  # say() itself is quiet in the processes that do not speak

    def print(self, text=""):
        """Text as printed; the numbers recorded since the last text are on its last line."""
        self.lines += text.split("\n")
        self.line_of.update((name, len(self.lines) - 1) for name in self.numbers if name not in self.line_of)
        if not self.quiet:
            print(text, flush=True)

    def header(self, template, numbers=None, prefix="", **words):
        self.print(f"\n== {self.fill(template, numbers, prefix, words)} ==")

    def subheader(self, template, numbers=None, prefix="", **words):
        self.print(f"\n-- {self.fill(template, numbers, prefix, words)} --")

    def line(self, template="", numbers=None, prefix="", **words):
        """One logged line, indented as the article's: the template's fields filled, the numbers recorded."""
        self.print(f"  {self.fill(template, numbers, prefix, words)}")

    def fill(self, template, numbers=None, prefix="", words=None):
        """The template's {name:spec} fields filled from numbers, each recorded as prefix + name at its first place
        (a list prints there and at its later places as its first place does), or from words: text, not recorded."""
        numbers, words, pieces, first = numbers or {}, words or {}, [], {}
        for text, name, spec, _ in FIELDS.parse(template):
            pieces.append(text)
            if name is None:
                continue
            if name not in numbers:
                if name not in words:
                    raise KeyError(f"{self.script}: the template {template!r} has a field {name!r} with no value")
                pieces.append(FORMATS[spec](words[name]) if spec in FORMATS else format(words[name], spec))
                continue
            value = numbers[name]
            listed = isinstance(value, (list, tuple)) or getattr(value, "ndim", 0) > 0
            if name not in first:
                first[name] = (self.nums(prefix + name, value, spec or "short") if listed else
                               self.num(prefix + name, value, spec))
            pieces.append(first[name] if listed else FORMATS[spec](value) if spec in FORMATS else format(value, spec))
        return "".join(pieces)

    def num(self, name, value, spec="", printed=True):
        """The number formatted with spec (a format spec or a name of FORMATS), recorded as `name` with the text it
        prints as. printed=False: a number a conclusion reads that the article's lines do not print (the evidence
        for a claim of its prose), recorded on no line."""
        if name in self.numbers:
            raise ValueError(f"{self.script}: the number {name!r} is printed twice")
        text = FORMATS[spec](value) if spec in FORMATS else format(value, spec)
        self.numbers[name] = {"value": float(value), "text": text.strip(), **getattr(value, "counts", {})}
        if not printed:
            self.line_of[name] = None
        return text

    def nums(self, name, values, spec="short", brackets=None, index=(), printed=True):
        """A (nested) list or array as the article prints it, '[[7.0, 5.0], [5.0, 15.0]]', a tuple (a shape) as
        '(197, 768)'; entry (i, j) is recorded as 'name[i,j]'."""
        values = values.tolist() if hasattr(values, "tolist") else values
        if not isinstance(values, (list, tuple)):
            return self.num(f"{name}[{','.join(map(str, index))}]", values, spec, printed)
        brackets = brackets or ("()" if isinstance(values, tuple) else "[]")
        entries = [self.nums(name, value, spec, brackets, index + (i,), printed) for i, value in enumerate(values, 1)]
        return brackets[0] + ", ".join(entries) + brackets[1]

    def pass_text(self, name, timing):
        """'[12 s, 0.2 s waiting for pictures]', both recorded ("<name> seconds"); --json keeps the pass whole."""
        self.passes[name] = dict(timing)
        return (f"[{self.num(f'{name} seconds', timing['seconds'], '.0f')} s, "
                f"{self.num(f'{name} waiting seconds', timing['waiting seconds'], '.1f')} s waiting for pictures]")

    def values(self):
        """{name: value} of every number printed so far."""
        return {name: number["value"] for name, number in self.numbers.items()}

    def cannot_run(self, title, problem):
        self.line('cannot run section "{title}": {problem}', title=title, problem=problem)
        self.could_not_run.append((title, problem))
