"""The article's logged numbers (data/reference_<script>.json) beside this run's numbers.

A reference entry is the number exactly as the article prints it, as a string. Unless the entry
states its own "tolerance" (numbers that depend on pretrained weights, library versions or random
draws), this run reproduces it when it rounds to the same printed digits: |run - article| is at
most half a unit of the article's last digit.
"""
import json
from decimal import Decimal
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def load_reference(script):
    """The {name: entry} reference numbers of one script, in the article's order."""
    with open(DATA_DIR / f"reference_{script}.json") as f:
        return json.load(f)["numbers"]


def article_value(text):
    return Decimal(text.replace(",", ""))


def tolerance(entry):
    if "tolerance" in entry:
        return float(entry["tolerance"])
    exponent = article_value(entry["article"]).as_tuple().exponent
    return 0.5 * 10.0 ** exponent * (1 + 1e-9)


def format_like(article_text, value):
    """This run's value printed with the article's digits: '34.9', '1,035,645', '4.0e-04'."""
    mantissa, _, power = article_text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    if power:
        return f"{value:.{decimals}e}"
    return f"{value:,.{decimals}f}" if "," in article_text else f"{value:.{decimals}f}"


def compare_with_article(results, reference):
    """Rows (name, article text, this run's text or None, reproduced?) for every reference number."""
    rows = []
    for name, entry in reference.items():
        value = results.get(name)
        if value is None:
            rows.append((name, entry["article"], None, False))
            continue
        same = abs(float(value) - float(article_value(entry["article"]))) <= tolerance(entry)
        rows.append((name, entry["article"], format_like(entry["article"], float(value)), same))
    return rows


def print_comparison(results, reference):
    """Print article | this run | same/differs, and return how many numbers were reproduced."""
    rows = compare_with_article(results, reference)
    width = max(len(name) for name, *_ in rows)
    print("\n== comparison with the article ==")
    print(f"  {'number':<{width}}  {'article':>14}  {'this run':>14}  ")
    for name, article, run, same in rows:
        verdict = "same" if same else ("not run" if run is None else "differs")
        print(f"  {name:<{width}}  {article:>14}  {run or '-':>14}  {verdict}")
    reproduced = sum(same for *_, same in rows)
    print(f"  {reproduced} of {len(rows)} article numbers reproduced")
    return reproduced
