"""The verdicts of a run, from one table and one function: judge() puts each number the article logs
(data/reference_<script>.json) beside this run's, and decides each of the article's conclusions, a rule over those
numbers (data/conclusions_<script>.json), under the ways this run's setup differs from the article's. What each
verdict means, and why it can be trusted: docs/compare.md.

A rule is a list of checks, [left, op, right, ...], each side a number's name or a constant:
  ["A", "<", "B"]                A is below B
  ["A", ">=", "B", offset]       A is at least B + offset (an offset below 0 is a slack)
  ["A", "==", "B"]               A is exactly B
  ["A", "within", "B", tol]      |A - B| <= tol
  ["A", "apart", "B", gap]       |A - B| >= gap
  ["A", "times", "B", low, high] low <= A / B <= high
An accuracy measured on n of N pictures (a sample of the article's set) is an exact interval from its counts, not a
point; the checks of a conclusion are decided on the intervals of the sampled numbers it reads, which hold together
with 95% (each at 1 - 0.05 / k, Bonferroni over its k sampled numbers), so a "holds" or a "fails" is wrong at most 5%
of the time, whatever the numbers' dependence; where the intervals allow both answers the check is undecided.
"""
import functools
import json
from collections import Counter

import numpy as np

from common.paths import CHECKOUT

REFERENCE_DIR = CHECKOUT / "data"  # the articles' numbers, data/reference_<script>.json, committed

NUMBER_VERDICTS = ("same", "close", "differs", "undecided", "varies", "not comparable", "not run")
LEVEL = 0.95  # the confidence of every interval, and of a conclusion's intervals together
LEGEND = ("same: equal at the article's digits; close: within the band the reference states, for the reason it "
          "states (for an accuracy on a sample of the article's pictures, this run's exact 95% interval inside the "
          "band); differs: outside it (the interval clear of the band); undecided: a sample's interval reaches both; "
          "varies: depends on chance, spread unmeasured, no claim; not comparable: this run's setup differs from the "
          "article's in an input of the number (the flag is named)")
OPERATORS = {"<": 0, ">=": 1, "==": 0, "within": 1, "apart": 1, "times": 2}  # each check's extra numbers
ROUND_OFF = 1e-12  # relative: a bound is met to this share of the numbers' size (float64's round-off is 1.1e-16)
MOST_DRAWN = 1_000_000  # pictures of a source without end: an undecided conclusion names no more than these


# ---------------------------------------------------------------- the table

def load_reference(script):
    """The {name: entry} reference numbers of one script, in the article's order."""
    with open(REFERENCE_DIR / f"reference_{script}.json") as f:
        return json.load(f)["numbers"]


def article_values(script):
    """{name: the article's number as a float}: the marks on the figures."""
    return {name: float(entry["article"].replace(",", "")) for name, entry in load_reference(script).items()}


def format_like(article_text, value):
    """This run's value printed with the article's digits: '34.9', '1,035,645', '4.0e-04'."""
    mantissa, _, power = article_text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    if decimals >= 15:  # Python's repr of a float (the backbone's eval dicts): more digits would be invented
        return repr(float(value))
    grouping = "," if "," in article_text else ""
    text = format(value, f".{decimals}e" if power else f"{grouping}.{decimals}f")
    return text[1:] if text.startswith("-") and float(text.replace(",", "")) == 0 else text  # -0.0 is 0.0


# ---------------------------------------------------------------- exact intervals, from counts

@functools.cache  # a pure function of its counts: a conclusion's search for pictures asks again
def accuracy_interval(right, n, total=None, level=LEVEL):
    """The exact `level` interval, in per cent, of the accuracy behind `right` of `n` pictures.

    Without total, the pictures are independent draws: Clopper-Pearson, the p with P(X >= right) = a/2 and
    P(X <= right) = a/2 for X ~ binomial(n, p), a = 1 - level. With total, they are n drawn without replacement from
    a set of total, of which K are right: the interval is every K/total that neither one-sided test rejects,
    P(X >= right | K) > a/2 and P(X <= right | K) > a/2 for X ~ hypergeometric(total, K, n); each test wrongly rejects
    the true K at most a/2 of the time, so the interval covers it at least `level` of the time. Neither collapses at
    0 or n right (but n = total: every picture is seen, and the accuracy is known exactly).
    """
    from scipy.stats import binomtest, hypergeom

    if not 0 <= right <= n or n < 1 or (total is not None and n > total):
        raise ValueError(f"an accuracy of {right} right of {n} pictures (of {total}) is not a count")
    alpha = 1 - level
    if total is None:
        interval = binomtest(int(right), int(n)).proportion_ci(confidence_level=level, method="exact")
        return 100 * interval.low, 100 * interval.high
    # P(X >= right | K) grows with K and P(X <= right | K) falls: each bound is found by bisection over K
    low = first_k(lambda k: hypergeom.sf(right - 1, total, k, n) > alpha / 2, right, total - (n - right))
    high = first_k(lambda k: not hypergeom.cdf(right, total, k, n) > alpha / 2, right, total - (n - right) + 1) - 1
    return 100 * low / total, 100 * high / total


def first_k(holds, low, high):
    """The smallest k in [low, high] for which holds(k), holds being false below some k and true from it on (high:
    when it holds nowhere below high)."""
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle + 1, high)
    return low


def number_interval(number, total, level=LEVEL):
    """(low, high) of a recorded accuracy in its own unit (its "scale": 100 for per cent, 1 for a fraction), of the
    `total` pictures it samples (None: independent draws). A mean over draws of the same pictures ("right" a list,
    one count a draw): each draw's interval at 1 - (1 - level) / draws, averaged, since all hold together with
    `level` (Bonferroni)."""
    rights = number["right"] if isinstance(number["right"], list) else [number["right"]]
    each = 1 - (1 - level) / len(rights)
    bounds = np.array([accuracy_interval(right, number["of"], total, each) for right in rights])
    scale = number.get("scale", 100) / 100
    return float(bounds[:, 0].mean() * scale), float(bounds[:, 1].mean() * scale)


def scaled(number, n):
    """The recorded accuracy as it would be counted on n pictures, at the same share right."""
    def at(right):
        return round(right * n / number["of"])

    rights = number["right"]
    return {**number, "right": [at(right) for right in rights] if isinstance(rights, list) else at(rights), "of": n}


# ---------------------------------------------------------------- how the setup differs from the article's

def flag_differences(args, article_flags):
    """{item: difference} for each flag whose value is not the article's; article_flags: {item: (dest, value)}."""
    differences = {}
    for item, (dest, article) in article_flags.items():
        value = getattr(args, dest)
        if value != article:
            value_text, article_text = (f"{v:g}" if isinstance(v, float) else str(v) for v in (value, article))
            flag = f"--{dest.replace('_', '-')} {value_text}"
            differences[item] = {"flag": flag, "why": f"{flag}: the article's is {article_text}"}
    return differences


def split_notes(differences):
    """(the differences that make this run another setup, the notes' reasons): a note ("note": True, moving nothing)
    says what was not checked of a setup that is the article's as far as the run can tell."""
    return ({item: difference for item, difference in differences.items() if not difference.get("note")},
            [difference["why"] for difference in differences.values() if difference.get("note")])


# ---------------------------------------------------------------- judging

def judge(script, numbers, differences=None, own=False):
    """(number rows, conclusion rows) of a run's recorded numbers ({name: {"value", ...}}) under its setup
    differences ({item: {"flag", "why", ...}}): every reference number of the script, then every conclusion of
    data/conclusions_<script>.json. A rule that has a check not one of OPERATORS, or reads a number the script never
    records (no reference entry), is refused, naming it: the tests judge every script's rules.

    own=True judges the conclusions on the run's own terms, as the articles' claims about a model of its own (the
    miniature's, job/miniature.py): its setup differences set nothing aside, and each counted accuracy is a sample of
    independent pictures drawn from its source (Clopper-Pearson), not of the article's set."""
    reference = json.loads((REFERENCE_DIR / f"reference_{script}.json").read_text())["numbers"]
    rows = {name: number_row(name, entry, numbers.get(name), differences or {}) for name, entry in reference.items()}
    path, conclusions = REFERENCE_DIR / f"conclusions_{script}.json", []
    for rule in json.loads(path.read_text())["conclusions"]:
        for check in rule["checks"]:
            if len(check) < 3 or check[1] not in OPERATORS or len(check) != 3 + OPERATORS[check[1]]:
                raise ValueError(f"{path.name}: the rule {rule['says']!r} has a check {check!r} that is not one of "
                                 f"{', '.join(OPERATORS)} with its numbers")
        reads = list(dict.fromkeys(side for check in rule["checks"] for side in (check[0], check[2])
                                   if isinstance(side, str)))
        unknown = [name for name in reads if name not in reference]
        if unknown:
            raise ValueError(f"{path.name}: the rule {rule['says']!r} reads {unknown[0]!r}, a number the script "
                             f"never records")
        conclusions.append(conclusion_row({**rule, "reads": reads}, rows, numbers, own))
    return list(rows.values()), conclusions


def number_row(name, entry, number, differences):
    """{name, article, kind, verdict, run, value, difference, band, why, flags, interval, sample} of one reference
    number. The setup differences that move it are those among its entry's "inputs" (without inputs, any but
    arithmetic's, kind nothing), unless one says it moves none ("moves": False); an accuracy whose one moving
    difference is the sample of pictures its entry names ("sample": n of "of" pictures), its counts recorded, is
    judged by this run's exact interval of the whole set's accuracy, which it keeps ("sample": that set's size)."""
    value = None if number is None else number["value"]
    article = float(entry["article"].replace(",", ""))
    row = {"name": name, "article": entry["article"], "kind": entry["kind"], "verdict": "not run",
           "run": None if value is None else format_like(entry["article"], value),
           "value": value, "difference": None if value is None else value - article}
    row.update({key: entry[key] for key in ("band", "why") if key in entry})
    inputs = entry.get("inputs")
    if value is None:  # not comparable when the setup never produces it, else not run
        moved = {item: difference for item, difference in differences.items()
                 if name in difference.get("removes", ())}
    else:
        moved = {item: difference for item, difference in differences.items() if difference.get("moves", True)
                 and (item in inputs if inputs is not None else entry["kind"] != "nothing")}
    sample = moved.get(entry.get("sample"), {})
    if len(moved) == 1 and sample.get("of") and "right" in number:
        low, high = number_interval(number, sample["of"])
        band = entry.get("band", 0.0)
        inside, clear = article - band - 1e-9 <= low and high <= article + band + 1e-9, \
            high < article - band - 1e-9 or article + band + 1e-9 < low
        right = number["right"] if isinstance(number["right"], int) else f"{sum(number['right'])} (over the draws)"
        row.update(verdict="close" if inside else "differs" if clear else "undecided", interval=[low, high],
                   sample=sample["of"],
                   why=f"{right} of {number['of']:,} right, a random sample of {sample['of']:,} pictures: this run's "
                       f"exact 95% interval of the whole set's accuracy, against the article's number"
                       + (" and its band" if band else ""))
    elif moved:
        row.update(verdict="not comparable", why="; ".join(difference["why"] for difference in moved.values()),
                   flags=list(dict.fromkeys(difference["flag"] for difference in moved.values())))
    elif value is not None:  # on the article's setup: same, close, differs, or varies (chance alone decides it)
        row["verdict"] = ("varies" if entry["kind"] == "chance" and "band" not in entry else
                          "same" if row["run"] == entry["article"] else
                          "close" if "band" in entry and abs(row["difference"]) <= entry["band"] else "differs")
    return row


def conclusion_row(rule, judged, numbers, own):
    """{says, article, why, verdict, reads, intervals, evidence, flags, pictures} of one conclusion: not run or not
    comparable when a number it reads is, else its checks' worst (fails, then undecided, then holds). Its sampled
    numbers (those judged by an interval; own: every counted one, of its own source) are intervals at 1 - 0.05 / k,
    k of them, so that all hold together with 95%. "evidence": the numbers it read as this run printed them, each
    sampled one with its interval."""
    read = [judged[name] for name in rule["reads"]]
    row = {"says": rule["says"], "article": rule["article"], "why": rule.get("why", ""),
           "reads": {number["name"]: number["value"] for number in read}}
    totals = ({number["name"]: None for number in read if "right" in numbers.get(number["name"], {})} if own else
              {number["name"]: number["sample"] for number in read if "sample" in number})
    level = 1 - (1 - LEVEL) / max(1, len(totals))

    def verdicts(n=None):  # of each check, the sampled numbers counted on this run's pictures or on n of them
        bounds = {name: number_interval(scaled(numbers[name], min(n, total or n)) if n else numbers[name], total, level)
                  for name, total in totals.items()}
        sides = [[bounds.get(side, (row["reads"].get(side), row["reads"].get(side))) if isinstance(side, str)
                  else (side, side) for side in (left, right)] for left, _, right, *_ in rule["checks"]]
        words = [decide(op, *pair, extra) for (_, op, _, *extra), pair in zip(rule["checks"], sides, strict=True)]
        return words, bounds

    def decided(n):
        return "undecided" not in verdicts(n)[0]

    if any(number["verdict"] == "not run" or own and number["value"] is None for number in read):
        row["verdict"] = "not run"
    elif not own and any(number["verdict"] == "not comparable" for number in read):
        flags = [flag for number in read if number["verdict"] == "not comparable" for flag in number["flags"]]
        row.update(verdict="not comparable", flags=list(dict.fromkeys(flags)))
    else:
        words, bounds = verdicts()
        row["verdict"] = next(word for word in ("fails", "undecided", "holds") if word in words)
        if totals:
            row["intervals"] = {name: list(interval) for name, interval in bounds.items()}
        most = max((total or MOST_DRAWN for total in totals.values()), default=0)
        if row["verdict"] == "undecided":  # about how many pictures, at this run's shares right, decide every check
            row["pictures"] = first_k(decided, min(numbers[name]["of"] for name in totals), most) if decided(most) \
                else None
    shown = row.get("intervals", {})
    row["evidence"] = ", ".join(f"{number['name']} {number['run'] or '-'}" + (
        f" [{shown[number['name']][0]:.4g} to {shown[number['name']][1]:.4g}]" if number["name"] in shown else "")
        for number in read)
    return row


def decide(op, left, right, extra):
    """holds, fails or undecided for the intervals left and right (a constant is an interval of one point). A bound
    (an offset, a tolerance, a gap, a ratio's limit) is met to float round-off: ROUND_OFF of the numbers' size, so
    that 98.2 is within 0.2 of 98.0 (their difference computes to 0.2000000000000028) and a tolerance of 1e-12 on
    numbers near 0 stays one. "<" and "==" are exact."""
    (a_low, a_high), (b_low, b_high) = left, right
    slack = ROUND_OFF * max(abs(value) for value in (a_low, a_high, b_low, b_high, *extra))
    if op == "<":
        return "holds" if a_high < b_low else "fails" if a_low >= b_high else "undecided"
    if op == ">=":
        return "holds" if a_low >= b_high + extra[0] - slack else "fails" if a_high < b_low + extra[0] - slack \
            else "undecided"
    if op == "==":
        return "holds" if a_low == a_high == b_low == b_high else "fails" if a_high < b_low or b_high < a_low \
            else "undecided"
    largest, smallest = max(a_high - b_low, b_high - a_low), max(0.0, a_low - b_high, b_low - a_high)
    if op == "within":
        return "holds" if largest <= extra[0] + slack else "fails" if smallest > extra[0] + slack else "undecided"
    if op == "apart":
        return "holds" if smallest >= extra[0] - slack else "fails" if largest < extra[0] - slack else "undecided"
    if op == "times":
        if b_low <= 0 <= b_high:
            return "undecided" if b_low < b_high else "fails"  # a ratio to 0 is no ratio
        ratios = [a / b for a in (a_low, a_high) for b in (b_low, b_high)]
        low, high = extra
        slack = ROUND_OFF * max(abs(value) for value in (*ratios, low, high))
        return "holds" if low - slack <= min(ratios) and max(ratios) <= high + slack else \
            "fails" if max(ratios) < low - slack or min(ratios) > high + slack else "undecided"
    raise ValueError(f"unknown check {op!r}")


# ---------------------------------------------------------------- as printed

def verdict_text(row):
    """The verdict of a number or a conclusion as printed: with the flags that made it not comparable, a number's
    interval, or the pictures that would decide a conclusion."""
    if row["verdict"] == "not comparable":
        return f"not comparable: {', '.join(row['flags'])}"
    if "interval" in row:
        return f"{row['verdict']} (95% interval {row['interval'][0]:.1f} to {row['interval'][1]:.1f})"
    if row["verdict"] == "undecided":
        more = (f"about {row['pictures']:,} pictures would decide it" if row.get("pictures") else
                "even all the pictures would not decide it")
        return f"undecided: this run's sample cannot tell; {more}"
    return row["verdict"]


def counts_text(rows):
    """'211 same, 0 close, 0 differs, 0 varies, 0 not comparable, 0 not run' of number rows, or '5 hold, 0 fail, 1
    undecided, 0 not run, 0 not comparable (of 6 conclusions)' of conclusion rows."""
    found = Counter(row["verdict"] for row in rows)
    if rows and "says" in rows[0]:
        return (f"{found['holds']} hold, {found['fails']} fail, {found['undecided']} undecided, {found['not run']} not "
                f"run, {found['not comparable']} not comparable (of {len(rows)} conclusions)")
    return ", ".join(f"{found[word]} {word}" for word in NUMBER_VERDICTS)


def comparison_lines(rows, conclusions, differences):
    """What --compare prints: the setup, article | this run | difference | verdict, the count of each verdict, then
    each conclusion with the numbers it read and their count."""
    width = max(len(row["name"]) for row in rows)
    lines = ["", "== comparison with the article =="]
    differences, notes = split_notes(differences)
    if differences:
        lines.append("  setup: this run differs from the article's, so the numbers that depend on these are not "
                     "comparable:")
        lines += [f"    {difference['why']}" for difference in differences.values()]
    else:
        lines.append("  setup: the article's")
    lines += [f"  note: {why}" for why in notes]
    row_line = f"  {{:<{width}}}  {{:>14}}  {{:>14}}  {{:>11}}  {{}}"
    lines.append(row_line.format("number", "article", "this run", "difference", "verdict"))
    for row in rows:
        difference = "" if row["difference"] is None else f"{row['difference']:+.3g}"
        lines.append(row_line.format(row["name"], row["article"], row["run"] or "-", difference, verdict_text(row)))
    lines += [f"  {counts_text(rows)} (of {len(rows)} article numbers)",
              f"  {LEGEND}"]
    if conclusions:
        lines += ["", "== the article's conclusions, decided by this run =="]
        for row in conclusions:
            lines += [f"  {verdict_text(row)}: {row['says']}", f"      this run: {row['evidence']}",
                      f"      the article: {row['article']}"]
        lines.append(f"  {counts_text(conclusions)}")
        if any(row.get("intervals") for row in conclusions):
            lines.append("  [a to b]: a sampled number's exact interval; those of one conclusion hold together with "
                         "95% (docs/compare.md)")
    return lines
