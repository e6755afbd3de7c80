"""The article's logged numbers (data/reference_<script>.json) beside this run's, with honest verdicts.

An entry holds the number exactly as the article prints it ("article", a string), what it depends on
("kind"), and for some a "band" with the reason for it ("why"):
  nothing  arithmetic, the by-hand examples, learning rates, ln 10: same or differs, nothing else;
  weights  the weights and the data, nothing random (accuracies, position-table statistics, the
           zero-head gradients): same, close (within the entry's band), or differs;
  chance   random draws, the order of the pictures, the device's round-off (few-shot draws, losses,
           gradient norms, timings): close or differs where the entry states a measured band,
           otherwise varies: both numbers and their difference are shown, with no claim.
"same" means equal at the article's printed digits.
"""
import json
from decimal import Decimal
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
KINDS = ("nothing", "weights", "chance")
VERDICTS = ("same", "close", "differs", "varies", "not run")
LEGEND = ("same: equal at the article's digits; close: within the band the reference states, for the reason it "
          "states; differs: outside it; varies: depends on chance, spread unmeasured, no claim")


def load_reference(script):
    """The {name: entry} reference numbers of one script, in the article's order."""
    with open(DATA_DIR / f"reference_{script}.json") as f:
        return json.load(f)["numbers"]


def article_values(script):
    """{name: the article's number as a float}: the marks on the figures."""
    return {name: article_value(entry["article"]) for name, entry in load_reference(script).items()}


def article_value(text):
    return float(Decimal(text.replace(",", "")))


def format_like(article_text, value):
    """This run's value printed with the article's digits: '34.9', '1,035,645', '4.0e-04'."""
    mantissa, _, power = article_text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    if power:
        text = f"{value:.{decimals}e}"
    else:
        text = f"{value:,.{decimals}f}" if "," in article_text else f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text.replace(",", "")) == 0 else text  # -0.0 is 0.0


def verdict(entry, value):
    """One of VERDICTS for this run's value (None: not run) against the entry."""
    if value is None:
        return "not run"
    if entry["kind"] == "chance" and "band" not in entry:
        return "varies"
    if format_like(entry["article"], value) == entry["article"]:
        return "same"
    if "band" in entry and abs(value - article_value(entry["article"])) <= entry["band"]:
        return "close"
    return "differs"


def compare(numbers, reference):
    """[{name, article, run, difference, kind, verdict, band, why}] for every reference number."""
    rows = []
    for name, entry in reference.items():
        value = numbers[name]["value"] if name in numbers else None
        row = {"name": name, "article": entry["article"], "kind": entry["kind"], "verdict": verdict(entry, value),
               "run": None if value is None else format_like(entry["article"], value),
               "value": value, "difference": None if value is None else value - article_value(entry["article"])}
        row.update({key: entry[key] for key in ("band", "why") if key in entry})
        rows.append(row)
    return rows


def verdict_counts(rows):
    return {word: sum(row["verdict"] == word for row in rows) for word in VERDICTS}


def print_comparison(rows, report):
    """article | this run | difference | verdict, then the count of each verdict."""
    width = max(len(row["name"]) for row in rows)
    report.header("comparison with the article")
    report.line(f"{'number':<{width}}  {'article':>14}  {'this run':>14}  {'difference':>11}  verdict")
    for row in rows:
        difference = "" if row["difference"] is None else f"{row['difference']:+.3g}"
        report.line(f"{row['name']:<{width}}  {row['article']:>14}  {row['run'] or '-':>14}  {difference:>11}  "
                    f"{row['verdict']}")
    counts = verdict_counts(rows)
    report.line(", ".join(f"{counts[word]} {word}" for word in VERDICTS) + f" (of {len(rows)} article numbers)")
    report.line(LEGEND)
