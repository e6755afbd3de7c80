"""common/conclusions.py: the articles' conclusions as rules; each holds on the article's own numbers, and each kind of
check holds, fails and is undecided on hand-made records."""
import json

import pytest

from common.conclusions import check_verdict, conclusion_lines, conclusion_rows, decide
from common.paths import REFERENCE_DIR
from common.reference import load_reference, sampling_interval

SCRIPTS = ("setup", "posemb", "fewshot", "finetune", "backbone")
SUBSET = {"validation pictures": {"flag": "--per-class 20", "why": "--per-class 20: 200 of 3,925", "n": 200,
                                  "of": 3925}}


def load_conclusions(script):
    """The rules of a script as data/conclusions_<script>.json holds them: [{says, article, checks}]."""
    return json.loads((REFERENCE_DIR / f"conclusions_{script}.json").read_text())["conclusions"]


def article_numbers(script):
    """The article's numbers of a script, as a run would record them."""
    return {name: {"value": float(entry["article"].replace(",", ""))} for name, entry in load_reference(script).items()}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_conclusion_holds_on_the_articles_own_numbers(script):
    """The rules say what the article says: its numbers, on its setup, satisfy every one of them."""
    rows = conclusion_rows(script, article_numbers(script), {})
    assert rows and [row["verdict"] for row in rows] == ["holds"] * len(rows), rows


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_rule_reads_numbers_the_script_records(script):
    reference = load_reference(script)
    for conclusion in load_conclusions(script):
        named = [side for check in conclusion["checks"] for side in (check[0], check[2]) if isinstance(side, str)]
        assert named and set(named) <= set(reference), conclusion["says"]


# [op, left interval, right interval, extra, verdict], worked out by hand
DECISIONS = [
    ("<", (1, 2), (3, 4), (), "holds"), ("<", (3, 4), (1, 2), (), "fails"), ("<", (1, 3), (2, 4), (), "undecided"),
    ("<", (2, 2), (2, 2), (), "fails"),  # equal is not below
    (">=", (5, 6), (5, 5), (-1,), "holds"), (">=", (3, 3.9), (5, 5), (-1,), "fails"),
    (">=", (3.5, 4.5), (5, 5), (-1,), "undecided"),
    ("==", (0, 0), (0, 0), (), "holds"), ("==", (1e-9, 1e-9), (0, 0), (), "fails"),
    ("within", (1, 1), (1.4, 1.4), (0.5,), "holds"), ("within", (1, 1), (1.6, 1.6), (0.5,), "fails"),
    ("within", (0.8, 1.2), (1.4, 1.4), (0.5,), "undecided"),  # the gap is 0.2 to 0.6
    ("times", (8, 8), (2, 2), (3.9, 4.1), "holds"), ("times", (9, 9), (2, 2), (3.9, 4.1), "fails"),
    # at the bounds: "at least" and "within" include them, "below" and "fails" do not
    (">=", (4, 4), (5, 5), (-1,), "holds"), (">=", (3.5, 4), (5, 5), (-1,), "undecided"),
    ("within", (1, 1), (1.5, 1.5), (0.5,), "holds"), ("within", (0.9, 1), (1.5, 1.5), (0.5,), "undecided"),
    ("==", (0, 1), (0, 0), (), "undecided"), ("==", (-1, 0), (0, 0), (), "undecided"),
    ("times", (8, 8), (2, 2), (4.0, 4.1), "holds"), ("times", (8, 8), (2, 2), (3.9, 4.0), "holds"),
]


@pytest.mark.parametrize("op,left,right,extra,verdict", DECISIONS)
def test_each_check_decides_as_worked_out_by_hand(op, left, right, extra, verdict):
    assert decide(op, left, right, extra) == verdict


def test_a_sampled_accuracy_is_the_same_interval_as_compares_and_says_what_sample_would_decide():
    """posemb on 200 of 3,925 pictures: 2D at 84.76% against 224 at 83.13% less 1 point cannot be told apart;
    the count it names is the fewest pictures whose intervals (scipy's hypergeometric) do tell, and one fewer does not."""
    reference = load_reference("posemb")
    values = {"2D bilinear of 1000": 84.76, "224 of 1000": 83.13}
    verdict, pictures = check_verdict(["2D bilinear of 1000", ">=", "224 of 1000", -1], values, reference, SUBSET)
    assert verdict == "undecided" and 200 < pictures < 3925

    def told_apart(n):
        low_2d = sampling_interval(84.76, n, 3925)[0]
        high_224 = sampling_interval(83.13, n, 3925)[1]
        return low_2d >= high_224 - 1

    assert told_apart(pictures) and not told_apart(pictures - 1)
    # the conclusion's count is the larger of its two checks' (bicubic's 84.97% needs fewer pictures)
    row = conclusion_rows("posemb", {name: {"value": value} for name, value in
                                     {**values, "2D bicubic of 1000": 84.97}.items()}, SUBSET)[0]
    assert row["verdict"] == "undecided" and row["pictures"] == pictures
    bicubic = check_verdict(["2D bicubic of 1000", ">=", "224 of 1000", -1], {**values, "2D bicubic of 1000": 84.97},
                            reference, SUBSET)
    assert bicubic[0] == "undecided" and bicubic[1] < pictures


@pytest.mark.parametrize("below,above,per_class", [(92.0, 99.69, 5), (48.38, 84.76, 1), (48.38, 52.0, 20),
                                                   (13.99, 48.38, 1), (83.13, 84.97, 30)])
def test_the_fewest_pictures_named_is_the_fewest_that_decide(below, above, per_class):
    """One accuracy below another, on 10 x per_class of 3,925 pictures: when the intervals touch, the count named
    tells them apart and one picture fewer does not (scipy's hypergeometric intervals, by hand)."""
    reference = load_reference("posemb")
    sample = {"validation pictures": {"flag": f"--per-class {per_class}", "n": 10 * per_class, "of": 3925}}
    verdict, pictures = check_verdict(["1D of 10", "<", "2D bilinear of 10"], {"1D of 10": below,
                                      "2D bilinear of 10": above}, reference, sample)

    def told_apart(n):
        return sampling_interval(below, n, 3925)[1] < sampling_interval(above, n, 3925)[0]

    assert verdict == "undecided" and told_apart(pictures) and not told_apart(pictures - 1)


@pytest.mark.parametrize("change,verdict", [
    ({"zero head body gradient norm": 1e-4}, "fails"),  # any gradient at all into the body
    ({"random head loss": 2.2}, "fails"),  # a random head below ln 10
    ({"average accuracy": 98.0}, "fails"),  # more than half a point from the last weights
])
def test_a_finetune_run_that_contradicts_a_conclusion_fails_it(change, verdict):
    numbers = article_numbers("finetune")
    numbers.update({name: {"value": value} for name, value in change.items()})
    rows = conclusion_rows("finetune", numbers, {})
    assert [row["verdict"] for row in rows].count(verdict) == 1


def test_a_missing_number_is_not_run_and_a_changed_input_is_not_comparable_naming_its_flag():
    """Another --lr changes the recipe the run's conclusions are about; the zero head's are the same at any --lr."""
    numbers = article_numbers("finetune")
    del numbers["zero head loss"]
    lr = {"lr": {"flag": "--lr 0.01", "why": "--lr 0.01: the article's is 0.003"}}
    rows = {row["says"][:20]: row for row in conclusion_rows("finetune", numbers, lr)}
    assert rows["with the zero head t"]["verdict"] == "not run"
    assert rows["after 5 steps the ac"]["verdict"] == "not comparable"
    assert rows["after 5 steps the ac"]["flags"] == ["--lr 0.01"]
    assert rows["the zero head sends "]["verdict"] == "holds"  # no input of it changed


def differences_of(*items):
    """Setup differences as the scripts record them: {item: {"flag", "why"}}, n of N pictures for a subset."""
    return {item: {"flag": flag, "why": f"{flag}: not the article's", **({"n": n, "of": of} if n else {})}
            for item, flag, n, of in items}


NC, HOLDS = "not comparable", "holds"
# [script, the run's setup differences, the article's numbers it never produced, each conclusion's verdict in order],
# worked out by hand from the numbers each conclusion reads and what moves them (data/reference_<script>.json): a
# conclusion is decided only when every number it reads is comparable, whatever its rule's own text says.
FLAGGED = [
    # posemb: the accuracies (first three), the stretch's differences (next three), the 14x14 corner, the neighbours
    ("posemb", {"resolution": {**differences_of(("resolution", "--resolution 512", 0, 0))["resolution"],
                               "removes": ["24x24 neighbours min", "24x24 neighbours max"]}},
     ["24x24 neighbours min", "24x24 neighbours max"], [NC, NC, NC, NC, NC, NC, HOLDS, NC]),  # no 24x24 grid
    ("posemb", differences_of(("precision", "--precision bf16", 0, 0)), [],
     [NC, NC, NC, HOLDS, HOLDS, HOLDS, HOLDS, HOLDS]),
    ("posemb", differences_of(("validation pictures", "--per-class 2", 20, 3925),
                              ("resolution", "--resolution 512", 0, 0)), [], [NC, NC, NC, NC, NC, NC, HOLDS, NC]),
    # few-shot: the hand example, then three rules on the means
    ("fewshot", differences_of(("resolution", "--resolution 384", 0, 0)), [], [HOLDS, NC, NC, NC]),
    ("fewshot", differences_of(("draws", "--draws 2", 0, 0)), [], [HOLDS, NC, NC, NC]),
    ("fewshot", differences_of(("training pictures", "--data-dir partial", 0, 0),
                               ("validation pictures", "--per-class 12", 120, 3925)), [], [HOLDS, NC, NC, NC]),
    # fine-tuning: zero head loss, its body gradient, the random head, after 5 steps, the losses, clipping, the end
    ("finetune", differences_of(("resolution", "--resolution 32", 0, 0)), [], [HOLDS, HOLDS, NC, NC, NC, NC, NC]),
    ("finetune", differences_of(("precision", "--precision bf16", 0, 0)), [], [HOLDS, HOLDS, NC, NC, NC, NC, NC]),
    ("finetune", differences_of(("checked pictures", "--check-per-class 10", 0, 0)), [],
     [HOLDS, HOLDS, HOLDS, NC, HOLDS, HOLDS, HOLDS]),
    ("finetune", differences_of(("validation pictures", "--per-class 50", 500, 3925)), [],
     [HOLDS, HOLDS, HOLDS, NC, HOLDS, HOLDS, NC]),
    ("finetune", {"steps": {"flag": "--steps 3", "why": "--steps 3", "removes": ["step 5 accuracy", "step 5 loss"]}},
     ["step 5 accuracy", "step 5 loss"], [HOLDS, HOLDS, HOLDS, NC, NC, NC, NC]),  # step 5 never logged: no "not run"
    # the backbone: the accuracies and the losses before and after fine-tuning
    ("backbone", differences_of(("precision", "--precision bf16", 0, 0)), [], [NC, NC]),
    ("backbone", differences_of(("validation pictures", "--per-class 4", 12, 133)), [], [NC, NC]),  # no sample
]


@pytest.mark.parametrize("script,differences,never,verdicts", FLAGGED)
def test_a_conclusion_on_a_number_a_flag_moved_is_not_comparable_naming_the_flag(script, differences, never, verdicts):
    numbers = {name: number for name, number in article_numbers(script).items() if name not in never}
    rows = conclusion_rows(script, numbers, differences)
    assert [row["verdict"] for row in rows] == verdicts
    flags = {difference["flag"] for difference in differences.values()}
    assert all(row["flags"] and set(row["flags"]) <= flags for row in rows if row["verdict"] == NC)


def test_a_number_not_run_makes_its_conclusion_not_run_before_any_flag():
    """A section that could not run leaves its numbers out: its conclusions are not run, whatever the flags."""
    numbers = article_numbers("finetune")
    del numbers["step 5 accuracy"]
    rows = conclusion_rows("finetune", numbers, differences_of(("resolution", "--resolution 32", 0, 0)))
    assert rows[3]["verdict"] == "not run" and "flags" not in rows[3]


def test_the_lines_after_the_table_name_each_verdict_and_count_them():
    numbers = article_numbers("backbone")
    numbers["after eval_accuracy"] = {"value": 0.5}
    lines = conclusion_lines(conclusion_rows("backbone", numbers, {}))
    assert lines[1] == "== the article's conclusions, decided by this run =="
    assert lines[2].startswith("  fails: fine-tuning on beans takes the model from near chance to near perfect")
    assert lines[-1] == "  1 hold, 1 fail, 0 undecided, 0 not run, 0 not comparable (of 2 conclusions)"


def contradicted(check, values):
    """values changed so that the check is plainly false: its left side moved past what it claims."""
    left, op, right, *extra = check
    values = dict(values)
    target = values[right] if isinstance(right, str) else right
    if not isinstance(left, str):  # a constant on the left, "0 < A": move A instead
        values[right] = left - 1
    elif op == "<":
        values[left] = target + 1
    elif op == ">=":
        values[left] = target + extra[0] - 1
    elif op == "==":
        values[left] = target + 1
    elif op == "within":
        values[left] = target + 2 * extra[0] + 1
    else:  # times: above its upper bound
        values[left] = target * (extra[1] + 1)
    return values


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_conclusion_fails_when_a_number_it_reads_contradicts_it(script):
    """Each conclusion, on the article's numbers with one of its checks made plainly false by hand: fails."""
    values = {name: number["value"] for name, number in article_numbers(script).items()}
    for conclusion in load_conclusions(script):
        for check in conclusion["checks"]:
            numbers = {name: {"value": value} for name, value in contradicted(check, values).items()}
            row = next(row for row in conclusion_rows(script, numbers, {}) if row["says"] == conclusion["says"])
            assert row["verdict"] == "fails", (conclusion["says"], check)


@pytest.mark.parametrize("script", ["posemb", "fewshot"])
def test_every_conclusion_on_sampled_accuracies_is_undecided_on_ten_pictures(script):
    """On 10 of 3,925 pictures each accuracy's interval spans tens of points: no rule that compares accuracies
    close in the article (2D and 224, 1 and 5 shots, the lambdas, the representations) is decided, and each says
    how many pictures would decide it; the rules on weights alone are decided as before."""
    reference = load_reference(script)
    ten = {"validation pictures": {"flag": "--per-class 1", "why": "--per-class 1: 10 of 3,925", "n": 10, "of": 3925}}
    for row, conclusion in zip(conclusion_rows(script, article_numbers(script), ten), load_conclusions(script)):
        sampled = [side for check in conclusion["checks"] for side in (check[0], check[2])
                   if isinstance(side, str) and reference[side].get("sample")]
        close = all(abs(article_value(reference, a) - article_value(reference, b)) < 5
                    for a, op, b, *_ in conclusion["checks"] if isinstance(a, str) and isinstance(b, str))
        if sampled and close:
            assert row["verdict"] == "undecided" and 10 < row["pictures"] <= 3925, row
        elif not sampled:
            assert row["verdict"] == "holds", row


def article_value(reference, name):
    return float(reference[name]["article"].replace(",", ""))
