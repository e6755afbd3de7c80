"""The article's line layout: section headers, indented lines, numbers in lists."""


def header(title):
    print(f"\n== {title} ==", flush=True)


def subheader(title):
    print(f"\n-- {title} --", flush=True)


def line(text=""):
    print(f"  {text}", flush=True)


def number_list(values, spec=".3f"):
    """[a, b, ...] with each number formatted by spec: '6.3f' gives '[ 0.632,  1.265]'."""
    return "[" + ", ".join(format(float(v), spec) for v in values) + "]"


def short(x, digits=4):
    """A float as Python prints it after rounding: 0.1875, -0.7, 1.0."""
    value = round(float(x), digits)
    return repr(value + 0.0)  # + 0.0 turns -0.0 into 0.0


def short_list(values, digits=4):
    """Nested lists as Python prints them, after rounding: [[7.0, 5.0], [5.0, 15.0]]."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (list, tuple)):
        return "[" + ", ".join(short_list(v, digits) for v in values) + "]"
    return short(values, digits)
