"""The articles' conclusions, decided by a run: each a rule over the numbers the run recorded
(data/conclusions_<script>.json), with a verdict; how they are read: docs/compare.md#the-conclusions.

A rule is a list of checks, [left, op, right, ...], the sides named numbers of the run or constants:
  ["A", "<", "B"]                A is below B
  ["A", ">=", "B", offset]       A is at least B + offset (offset may be negative: a slack)
  ["A", "==", value]             A is exactly value
  ["A", "within", "B", tol]      |A - B| <= tol
  ["A", "times", "B", low, high] low <= A / B <= high
A conclusion is decided only on numbers --compare can judge: when one it reads is not comparable (a flag moved it,
or the run's setup never produces it), so is the conclusion, with the flags; when one was not run, so is it. An
accuracy measured on a sample of its pictures (its reference entry's "sample", with n of N pictures in the setup's
differences) is an interval, the same hypergeometric 95% interval as --compare's; a check whose intervals allow both
answers is undecided.
"""
import json
from collections import Counter

from common.paths import REFERENCE_DIR
from common.reference import compare, load_reference, sampling_interval, verdict_text

WORST_FIRST = ("fails", "undecided", "holds")  # a decided conclusion's verdict: its checks' worst


def interval(value, entry, differences, n=None):
    """(low, high) of a number: the value itself, or, for an accuracy on n of N pictures, its 95% interval (n: another
    sample size, to ask what it would decide)."""
    sample = differences.get(entry.get("sample")) if entry else None
    if not sample or "n" not in sample:
        return value, value
    return sampling_interval(value, n or sample["n"], sample["of"])


def decide(op, left, right, extra):
    """holds, fails or undecided for intervals left and right (constants are intervals of one point)."""
    (a_low, a_high), (b_low, b_high) = left, right
    if op == "<":
        return "holds" if a_high < b_low else "fails" if a_low >= b_high else "undecided"
    if op == ">=":
        return "holds" if a_low >= b_high + extra[0] else "fails" if a_high < b_low + extra[0] else "undecided"
    if op == "==":
        return "holds" if a_low == a_high == b_low else "fails" if not a_low <= b_low <= a_high else "undecided"
    if op == "within":
        largest, smallest = max(a_high - b_low, b_high - a_low), max(0.0, a_low - b_high, b_low - a_high)
        return "holds" if largest <= extra[0] else "fails" if smallest > extra[0] else "undecided"
    if op == "times":
        low, high = extra
        return "holds" if low <= a_low / b_low <= high else "fails"
    raise ValueError(f"unknown check {op!r}")


def check_verdict(check, values, reference, differences):
    """(verdict, pictures that would decide it or None) of one check over the run's values ({name: value})."""
    left_name, op, right_name, *extra = check
    names = [side for side in (left_name, right_name) if isinstance(side, str)]

    def sides(n=None):
        return [interval(values[side], reference.get(side), differences, n) if isinstance(side, str)
                else (side, side) for side in (left_name, right_name)]

    verdict = decide(op, *sides(), extra)
    if verdict != "undecided":
        return verdict, None
    samples = [differences[reference[name]["sample"]] for name in names if reference.get(name, {}).get("sample")
               in differences]
    low, high = min(sample["n"] for sample in samples), min(sample["of"] for sample in samples)  # no more than all
    if decide(op, *sides(high), extra) == "undecided":
        return "undecided", None  # no sample of these pictures decides it: the whole set is needed and not enough
    while high - low > 1:  # the fewest pictures whose intervals, at this run's values, decide it
        middle = (low + high) // 2
        low, high = (low, middle) if decide(op, *sides(middle), extra) != "undecided" else (middle, high)
    return "undecided", high


def conclusion_rows(script, numbers, differences):
    """[{says, article, verdict, flags, pictures}] of the script's conclusions for a run's recorded numbers
    ({name: {"value": ...}}) under its setup differences."""
    path = REFERENCE_DIR / f"conclusions_{script}.json"  # [{says, article, checks}], in the article's order
    if not path.is_file():
        return []
    reference = load_reference(script)
    judged = {row["name"]: row for row in compare(numbers, reference, differences)}  # each number as --compare's
    values = {name: number["value"] for name, number in numbers.items()}
    rows = []
    for conclusion in json.loads(path.read_text())["conclusions"]:
        row = {"says": conclusion["says"], "article": conclusion["article"]}
        read = [judged[side] for check in conclusion["checks"] for side in (check[0], check[2]) if isinstance(side, str)]
        if any(number["verdict"] == "not run" for number in read):
            row["verdict"] = "not run"
        elif any(number["verdict"] == "not comparable" for number in read):
            flags = [flag for number in read if number["verdict"] == "not comparable" for flag in number["flags"]]
            row.update(verdict="not comparable", flags=list(dict.fromkeys(flags)))
        else:
            verdicts = [check_verdict(check, values, reference, differences) for check in conclusion["checks"]]
            words = [word for word, _ in verdicts]
            row["verdict"] = next(word for word in WORST_FIRST if word in words)
            needed = [pictures for word, pictures in verdicts if word == "undecided"]
            if row["verdict"] == "undecided":
                row["pictures"] = None if None in needed else max(needed)
        rows.append(row)
    return rows


def counts_text(rows):
    """'5 hold, 0 fail, 1 undecided, 0 not run, 0 not comparable (of 6 conclusions)'."""
    found = Counter(row["verdict"] for row in rows)
    return (f"{found['holds']} hold, {found['fails']} fail, {found['undecided']} undecided, {found['not run']} not run, "
            f"{found['not comparable']} not comparable (of {len(rows)} conclusions)")


def conclusion_lines(rows):
    """What --compare prints after its table: each conclusion, its verdict, then the counts."""
    if not rows:
        return []
    lines = ["", "== the article's conclusions, decided by this run =="]
    for row in rows:
        lines += [f"  {verdict_text(row)}: {row['says']}", f"      (the article: {row['article']})"]
    return [*lines, f"  {counts_text(rows)}"]
