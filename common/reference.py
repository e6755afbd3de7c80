"""The article's logged numbers (data/reference_<script>.json) beside this run's, with honest verdicts: the entries
and the verdicts are docs/compare.md's."""
import json
import math
from collections import Counter

from common.paths import REFERENCE_DIR

VERDICTS = ("same", "close", "differs", "varies", "not comparable", "not run")
LEGEND = ("same: equal at the article's digits; close: within the band the reference states, for the reason it "
          "states; differs: outside it; varies: depends on chance, spread unmeasured, no claim; not comparable: "
          "this run's setup differs from the article's in an input of the number (the flag is named)")


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


def verdict(entry, value):
    """Same, close, differs or varies: this run's value against the entry on the article's setup (compare: the rest)."""
    if entry["kind"] == "chance" and "band" not in entry:
        return "varies"
    if format_like(entry["article"], value) == entry["article"]:
        return "same"
    if "band" in entry and abs(value - float(entry["article"].replace(",", ""))) <= entry["band"]:
        return "close"
    return "differs"


def sampling_interval(article_percent, n, total, band=0.0):
    """The 95% interval (%) of an accuracy on n of total pictures, hypergeometric, K widened by the band
    (docs/compare.md)."""
    from scipy.stats import hypergeom

    right, slack = article_percent * total / 100, math.ceil(band * total / 100 - 1e-9)
    low = hypergeom.ppf(0.025, total, max(0, math.floor(right + 1e-9) - slack), n)
    high = hypergeom.ppf(0.975, total, min(total, math.ceil(right - 1e-9) + slack), n)
    return 100 * low / n, 100 * high / n


def compare(numbers, reference, differences=None):
    """[{name, article, kind, verdict, run, value, difference, band, why}] for every reference number, under the setup
    differences of common/differences.py: a number that a difference moves (one of its "inputs"; without inputs,
    any but arithmetic's) or never produces ("removes") is not comparable, with the flags; an accuracy that only its
    "sample" moves is close or differs by the sample's 95% interval; the rest by verdict()."""
    rows, differences = [], differences or {}
    for name, entry in reference.items():
        value = numbers[name]["value"] if name in numbers else None
        article = float(entry["article"].replace(",", ""))
        row = {"name": name, "article": entry["article"], "kind": entry["kind"], "verdict": "not run",
               "run": None if value is None else format_like(entry["article"], value),
               "value": value, "difference": None if value is None else value - article}
        row.update({key: entry[key] for key in ("band", "why") if key in entry})
        inputs = entry.get("inputs")  # None: every difference moves it, unless it is arithmetic (kind nothing)
        if value is None:  # not comparable when the setup never produces it, else not run
            moved = {item: difference for item, difference in differences.items()
                     if name in difference.get("removes", ())}
        else:
            moved = {item: difference for item, difference in differences.items() if difference.get("moves", True)
                     and (item in inputs if inputs is not None else entry["kind"] != "nothing")}
        sample = moved.get(entry.get("sample"), {})
        if value is not None and len(moved) == 1 and sample.get("of"):
            low, high = sampling_interval(article, sample["n"], sample["of"], entry.get("band", 0.0))
            row.update(verdict="close" if low - 1e-9 <= value <= high + 1e-9 else "differs", interval=[low, high],
                       why=f"{sample['n']:,} of {sample['of']:,} pictures (the first of each class, taken as a random "
                           f"sample): the 95% hypergeometric interval of the article's number"
                           + (", widened by its band" if "band" in entry else ""))
        elif moved:
            row.update(verdict="not comparable", why="; ".join(difference["why"] for difference in moved.values()),
                       flags=list(dict.fromkeys(difference["flag"] for difference in moved.values())))
        elif value is not None:
            row["verdict"] = verdict(entry, value)
        rows.append(row)
    return rows


def verdict_text(row):
    """The verdict of a number (compare's row) or of a conclusion (common/conclusions.py's) as printed: with the flags
    that made it not comparable, a number's interval of a sample, or the pictures that would decide a conclusion."""
    if row["verdict"] == "not comparable":
        return f"not comparable: {', '.join(row['flags'])}"
    if "interval" in row:
        return f"{row['verdict']} (95% interval {row['interval'][0]:.1f} to {row['interval'][1]:.1f})"
    if row["verdict"] == "undecided":
        more = (f"about {row['pictures']:,} pictures would decide it" if row["pictures"] else
                "even all the pictures would not decide it")
        return f"undecided: this run's sample cannot tell; {more}"
    return row["verdict"]


def counts_text(counts):
    """'211 same, 0 close, 0 differs, 0 varies, 0 not comparable, 0 not run' from Counter(row["verdict"] ...)."""
    return ", ".join(f"{counts[word]} {word}" for word in VERDICTS)


def print_comparison(rows, report, differences=None):
    """The setup, then article | this run | difference | verdict, then the count of each verdict."""
    width = max(len(row["name"]) for row in rows)
    report.header("comparison with the article")
    if differences:
        report.line("setup: this run differs from the article's, so the numbers that depend on these are not "
                    "comparable:")
        for difference in differences.values():
            report.line("  {why}", why=difference["why"])
    else:
        report.line("setup: the article's")
    row_line = f"{{name:<{width}}}  {{article:>14}}  {{run:>14}}  {{difference:>11}}  {{verdict}}"
    report.line(row_line, name="number", article="article", run="this run", difference="difference", verdict="verdict")
    for row in rows:
        difference = "" if row["difference"] is None else f"{row['difference']:+.3g}"
        report.line(row_line, name=row["name"], article=row["article"], run=row["run"] or "-", difference=difference,
                    verdict=verdict_text(row))
    counts = Counter(row["verdict"] for row in rows)
    report.line("{counts} (of {total} article numbers)", counts=counts_text(counts), total=len(rows))
    report.line("{legend}", legend=LEGEND)
