"""compare/verdicts.py: the one verdict table and its function. The exact intervals cover what they claim (exact
enumeration, against SciPy's distributions); every rule holds on the article's own numbers and fails on numbers that
contradict its claim (a table, a row or more a rule); the checks decide as worked out by hand; a number or conclusion
that a setup difference moves is not comparable, naming the flag."""
import json
import math

import numpy as np
import pytest
from scipy.stats import beta, binom, hypergeom

from compare import data_set, verdicts
from compare.verdicts import (
    accuracy_interval,
    decide,
    format_like,
    judge,
    load_reference,
    number_interval,
    number_row,
)

SCRIPTS = ("setup", "posemb", "fewshot", "finetune", "backbone")


def article_numbers(script, **changed):
    """The article's numbers of a script as a run on the article's setup records them (its whole set of pictures:
    no counts are needed), with some changed."""
    numbers = {name: {"value": float(entry["article"].replace(",", ""))}
               for name, entry in load_reference(script).items()}
    numbers.update({name: {"value": value} for name, value in changed.items()})
    return numbers


def conclusion(rows, says):
    """The one conclusion row whose "says" starts so."""
    [row] = [row for row in rows if row["says"].startswith(says)]
    return row


def rules_of(script):
    """The conclusions of a script as data/conclusions_<script>.json holds them, each with the names it reads."""
    rules = json.loads((verdicts.REFERENCE_DIR / f"conclusions_{script}.json").read_text())["conclusions"]
    return [{**rule, "reads": list(row["reads"])} for rule, row in zip(rules, judge(script, {})[1], strict=True)]


# ---------------------------------------------------------------- the exact intervals

def coverage(interval, distribution, outcomes, truth):
    """The probability, by exact enumeration over every outcome, that the interval of the outcome holds the truth."""
    return sum(distribution.pmf(k) for k in outcomes if interval(k)[0] - 1e-9 <= truth <= interval(k)[1] + 1e-9)


@pytest.mark.parametrize("n", [5, 10, 50])
@pytest.mark.parametrize("p", [0.0, 0.03, 0.5, 0.9, 0.9969, 1.0])
def test_the_binomial_interval_covers_every_true_accuracy_at_least_95_percent(p, n):
    covered = coverage(lambda k: accuracy_interval(k, n), binom(n, p), range(n + 1), 100 * p)
    assert covered >= 0.95 - 1e-12


@pytest.mark.parametrize("total,n", [(20, 5), (60, 30), (200, 50), (3925, 10)])
@pytest.mark.parametrize("share", [0.0, 0.05, 0.5, 0.92, 0.9969, 1.0])
def test_the_hypergeometric_interval_covers_every_true_count_at_least_95_percent(total, n, share):
    right = round(share * total)  # the true count of the whole set
    covered = coverage(lambda k: accuracy_interval(k, n, total), hypergeom(total, right, n), range(n + 1),
                       100 * right / total)
    assert covered >= 0.95 - 1e-12


@pytest.mark.parametrize("right,n", [(0, 10), (3, 10), (10, 10), (49, 50), (50, 50)])
def test_the_binomial_interval_is_clopper_pearsons_from_the_beta_quantiles(right, n):
    low = 0.0 if right == 0 else beta.ppf(0.025, right, n - right + 1)
    high = 1.0 if right == n else beta.ppf(0.975, right + 1, n - right)
    assert accuracy_interval(right, n) == pytest.approx((100 * low, 100 * high))


def by_counting(right, n, total, alpha=0.05):
    """Every K/total that neither one-sided test rejects, the tails summed with math.comb."""
    def pmf(k, big_k):
        return math.comb(big_k, k) * math.comb(total - big_k, n - k) / math.comb(total, n)

    kept = [big_k for big_k in range(total + 1)
            if sum(pmf(k, big_k) for k in range(right, n + 1)) > alpha / 2
            and sum(pmf(k, big_k) for k in range(right + 1)) > alpha / 2]
    return 100 * kept[0] / total, 100 * kept[-1] / total


@pytest.mark.parametrize("right,n,total", [(0, 5, 20), (5, 5, 20), (3, 5, 20), (29, 30, 60), (30, 30, 60),
                                           (12, 40, 120)])
def test_the_hypergeometric_interval_is_the_inverted_pair_of_one_sided_tests(right, n, total):
    assert accuracy_interval(right, n, total) == pytest.approx(by_counting(right, n, total))


@pytest.mark.parametrize("total", [None, 3925])
def test_no_interval_collapses_at_none_or_all_right(total):
    """The plug-in interval gave 50 of 50 right [100, 100]: the exact one leaves room below 100, and above 0."""
    all_right, none_right = accuracy_interval(50, 50, total), accuracy_interval(0, 50, total)
    assert all_right[1] == 100 and 90 < all_right[0] < 95
    assert none_right[0] == 0 and 5 < none_right[1] < 10


def test_every_picture_seen_is_the_accuracy_itself():
    assert accuracy_interval(3913, 3925, 3925) == pytest.approx((100 * 3913 / 3925,) * 2)


def test_a_mean_over_draws_is_the_mean_of_each_draws_interval_at_the_bonferroni_level():
    mean = {"value": 95.0, "right": [18, 19, 20], "of": 20}
    each = [accuracy_interval(right, 20, 100, 1 - 0.05 / 3) for right in (18, 19, 20)]
    assert number_interval(mean, 100) == pytest.approx(tuple(np.mean(each, axis=0)))
    fraction = {"value": 0.9, "right": 18, "of": 20, "scale": 1}
    assert number_interval(fraction, None) == pytest.approx(tuple(x / 100 for x in accuracy_interval(18, 20)))


@pytest.mark.parametrize("right,n,total", [(-1, 10, None), (11, 10, None), (5, 0, None), (0, 0, None), (0, 0, 5),
                                           (5, 20, 10)])
def test_a_count_that_is_not_one_is_refused(right, n, total):
    with pytest.raises(ValueError, match="is not a count"):
        accuracy_interval(right, n, total)


def test_one_picture_is_a_count_too():
    assert accuracy_interval(1, 1) == pytest.approx((2.5, 100.0)) and accuracy_interval(1, 1, 1) == (100.0, 100.0)


# ---------------------------------------------------------------- the rules against the article

@pytest.mark.parametrize("script", SCRIPTS)
def test_every_rule_holds_on_the_articles_own_numbers(script):
    """The rules say what the article says: its numbers, on its setup, satisfy every one of them."""
    rows = judge(script, article_numbers(script))[1]
    assert rows and [row["verdict"] for row in rows] == ["holds"] * len(rows), rows


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_rule_says_why_its_margins_are_what_they_are(script):
    for rule in rules_of(script):
        assert rule["says"] and rule["article"] and len(rule["why"]) > 20, rule["says"]


CHANCE_MEANS = {f"{rep} lambda {lam} {shots}-shot mean": 10.0 for rep in ("pre-logits", "class token")
                for lam in ("0.01", "1", "100") for shots in (1, 5, 10)}
# (script, the start of the rule's "says", numbers that contradict the claim as the article states it): each row makes
# its rule fail. Many pass a rule that only checks a direction where the article states a level or a size.
CONTRADICTING = [
    ("setup", "ViT-B/16 needs almost exactly 4", {"B/16 over B/32 compute at 224": 4.5}),
    ("setup", "ViT-B/16 needs almost exactly 4", {"B/16 over B/32 compute at 224": 3.8}),
    ("setup", "the extra over 4 comes from attention", {"B/16 over B/32 compute at 224": 3.98}),  # no extra at all
    # the tokens alone grow x4.2
    ("setup", "the extra over 4 comes from attention", {"ViT-B/16 at 224: sequence": 210}),
    ("setup", "ViT-B/32 has 1.9% more", {"B/32 over B/16 percent": 5.0}),
    ("setup", "ViT-B/32 has 1.9% more", {"ViT-B/32 backbone": 85e6}),  # fewer
    ("setup", "Table 1's 307M", {"ViT-L/32 with pre-logits (M)": 305.5}),
    ("setup", "Table 1's 307M", {"ViT-L/16 without (M)": 306.8}),  # then both would fit
    ("setup", "Table 1's 307M", {"ViT-L/16 pre-logits": 1_049_600}),  # the checkpoint has one after all
    ("setup", "at 384 pixels ViT-B/16's sequence", {"sequence 384 over 224": 3.2}),
    ("setup", "the extended stage 3", {"stage 3 over stage 4 tokens": 2, "option (ii) tokens": 98}),
    ("setup", "with Batch Norm", {"BN partner 2[1]": -1.26, "BN partner 2[2]": -0.7}),  # the same output
    ("setup", "with Group Norm", {"GN partner 2[1]": -1.3}),
    ("setup", "after Weight Standardization", {"WS filters smallest std": 0.9}),
    ("setup", "after Weight Standardization", {"WS filters largest mean": 0.01}),
    ("setup", "the first step of Adam", {"Adam t=1 step at g=1000": 0.002}),  # the size of the gradient matters
    ("setup", "the 10,000 warm-up steps", {"pre-training ViT on ImageNet: warm-up %": 5.0}),
    ("setup", "the 10,000 warm-up steps", {"pre-training ViT on ImageNet: warm-up %": 10.0}),  # not almost 11
    ("setup", "the 10,000 warm-up steps", {"pre-training ViT-B/16 on JFT-300M: warm-up %": 2.5}),
    ("setup", "momentum keeps", {"SGD t=2 velocity": -0.05, "SGD t=2 w": 0.9955}),
    ("setup", "the Polyak average smooths", {"Polyak average[5]": 1.1}),
    ("setup", "a factor of 0.9999", {"Polyak 0.9999 memory": 1000}),
    ("setup", "clipping keeps", {"clipped length": 0.8}),
    ("setup", "clipping keeps", {"clipped cosine with the gradient": 0.9}),
    ("setup", "cosine decay", {"cosine LR at 10,000": 0.02}),
    ("setup", "small tasks get many passes", {"Oxford-IIIT Pets: passes": 5.0}),
    ("setup", "small tasks get many passes", {"VTAB task: pictures seen (M)": 20.0}),  # more steps than ImageNet
    ("setup", "Pets is seen about 70 times", {"Oxford-IIIT Pets: passes": 50.0}),
    ("posemb", "resizing a grid the official way", {"3x3 grid[1,1]": 0.5}),
    ("posemb", "resizing a grid the official way", {"2x2 centre": 1.0}),
    ("posemb", "our bilinear loop", {"bilinear vs scipy max diff": 1e-6}),  # float32's round-off, not float64's
    ("posemb", "our bicubic call", {"bicubic vs library max diff": 1e-7}),
    ("posemb", "the official (bilinear)", {"bilinear vs bicubic mean diff": 0.0}),  # the same
    ("posemb", "the official (bilinear)", {"bilinear vs bicubic mean diff": 0.05}),  # not close
    ("posemb", "the official stretch keeps the corner", {"corner max diff": 0.01}),
    ("posemb", "a position row is like its four", {"own grid far corner": 0.29}),  # far below, but not unlike
    ("posemb", "a position row is like its four", {"own grid neighbours min": 0.3}),  # not like
    ("posemb", "after the stretch the same place", {"stretched grid neighbours min": 0.7}),
    ("posemb", "the two 2D stretches keep", {"224 of 1000": 0.0, "2D bilinear of 1000": 0.0,
                                             "2D bicubic of 1000": 0.0}),  # nothing works
    ("posemb", "the two 2D stretches keep", {"2D bilinear of 1000": 80.0}),  # 3 points lost
    ("posemb", "read at only the 10 Imagenette", {"2D bicubic of 10": 95.0}),
    ("posemb", "the 2D stretches give a small gain", {"2D bilinear of 1000": 82.0}),  # a loss
    ("posemb", "the 2D stretches give a small gain", {"2D bicubic of 1000": 95.0}),  # not small
    ("posemb", "the 2D stretches give a small gain", {"2D bilinear of 1000": 83.155}),  # one picture of 3,925
    ("posemb", "the 1D stretch is a disaster", {"1D of 1000": 84.5}),  # a fraction of a point below
    ("posemb", "the 1D stretch is a disaster", {"1D of 1000": 70.0}),  # 15 points: a loss, not a disaster
    ("posemb", "the 1D stretch is a disaster", {"1D of 10": 99.8}),
    ("posemb", "the 1D stretch is a disaster", {"1D of 10": 99.66}),  # below, by a picture
    ("posemb", "with no position rows", {"zeros of 1000": 45.0}),
    ("posemb", "with no position rows", {"zeros of 1000": 38.0}),  # 10 points: a loss, not the article's fall
    ("posemb", "with no position rows", {"zeros of 10": 91.95}),
    ("finetune", "with the zero head the first loss", {"zero head loss": 2.31}),
    ("finetune", "the zero head sends exactly no", {"zero head body gradient norm": 1e-4}),
    ("finetune", "the head itself does get", {"head gradient max diff": 0.01}),
    ("finetune", "the head itself does get", {"head gradient norm autograd": 0.0}),
    ("finetune", "so step 1 changes only the head", {"head gradient norm by hand": 0.0}),  # nothing changes
    ("finetune", "so step 1 changes only the head", {"zero head body gradient norm": 0.1}),
    ("finetune", "a random head sends", {"random head loss": 2.2}),
    ("finetune", "a random head sends", {"random head body gradient norm": 0.0}),
    ("finetune", "a random head sends", {"random head body gradient norm": 1e-6}),  # round-off, not a gradient
    ("finetune", "a random head's scores are small noise", {"random head logit max": 5.0}),
    ("finetune", "a random head's scores are small noise", {"random head logit min": 0.01}),  # all of one sign
    ("finetune", "after 5 steps the accuracy", {"step 5 accuracy": 30.0}),  # far above chance, far from perfect
    ("finetune", "after 5 steps the accuracy", {"step 0 validation": 40.0}),
    ("finetune", "after 5 steps the accuracy", {"step 5 accuracy": 95.0}),  # three times the article's errors
    ("finetune", "while after 5 steps the loss", {"step 5 loss": 1.5}),  # the loss has moved
    ("finetune", "while after 5 steps the loss", {"step 5 loss": 2.3026}),  # not at all
    ("finetune", "the remaining steps mostly", {"mean loss last": 1.0}),  # below ln 10 / 2, far from confident
    ("finetune", "the remaining steps mostly", {"step 5 accuracy": 90.0}),  # the accuracy rose 9.7 points after it
    ("finetune", "at batch 32 the cap of 1", {"clipped steps": 200}),  # most steps, but a guard half the time
    ("finetune", "at batch 32 the cap of 1", {"median norm last": 0.8}),
    ("finetune", "the run sees about one pass", {"passes": 2.0}),
    ("finetune", "the weight average and the last", {"average accuracy": 98.0}),
    ("finetune", "the weight average and the last", {"average accuracy": 95.0, "last accuracy": 95.2}),  # not perfect
    ("finetune", "the weight average and the last", {"average accuracy": 99.9, "last accuracy": 99.4}),
    ("fewshot", "in the example by hand", {"new picture scores[1]": -0.7, "new picture scores[2]": 0.7}),
    # lambda 0
    ("fewshot", "in the example by hand", {"new picture scores[1]": 0.932, "new picture scores[2]": -0.932}),
    ("fewshot", "in the example by hand", {"training scores[4,1]": 0.1}),
    ("fewshot", "with two classes, the second column", {"W[1,2]": -0.5}),
    ("fewshot", "one picture per class already does well", CHANCE_MEANS),  # every mean at chance
    ("fewshot", "one picture per class already does well", {"pre-logits lambda 1 1-shot mean": 90.0}),
    ("fewshot", "one picture per class already does well", {"pre-logits lambda 1 1-shot mean": 95.0}),
    ("fewshot", "more shots help", {"pre-logits lambda 1 1-shot mean": 99.5}),  # 1-shot beats 5-shot
    ("fewshot", "more shots help", {"pre-logits lambda 1 5-shot mean": 98.03}),  # a picture better
    ("fewshot", "lambda hardly matters", {"pre-logits lambda 100 1-shot mean": 99.5}),
    ("fewshot", "lambda hardly matters", CHANCE_MEANS),
    ("fewshot", "the two representations", {"class token lambda 1 1-shot mean": 98.5}),
    ("fewshot", "the two representations", {"class token lambda 100 1-shot mean": 95.0}),  # another cell
    ("fewshot", "lambda hardly matters", {"pre-logits lambda 100 10-shot mean": 93.0}),  # at 10 shots
    ("fewshot", "the two representations", CHANCE_MEANS),
    ("fewshot", "the scores of one tench picture", {"first picture score 1": 0.1}),
    ("fewshot", "the scores of one tench picture", {"first picture score 1": 5.0}),  # not about +1
    ("fewshot", "the scores of one tench picture", {"first picture score 5": -0.3}),
    ("backbone", "patch tokens (B, N, D) become", {"feature map shape[2]": 16}),
    ("backbone", "vit-base-patch16-224 is what its name", {"Patch size": 32}),
    ("backbone", "fine-tuning takes the accuracy on beans", {"before eval_accuracy": 0.8}),  # barely higher
    ("backbone", "fine-tuning takes the accuracy on beans", {"after eval_accuracy": 0.5}),
    ("backbone", "and its evaluation loss falls", {"after eval_loss": 1.5}),
]


@pytest.mark.parametrize("script,says,changed", CONTRADICTING, ids=[f"{s}: {says}" for s, says, _ in CONTRADICTING])
def test_numbers_that_contradict_a_claim_make_its_rule_fail(script, says, changed):
    rows = judge(script, article_numbers(script, **changed))[1]
    [row] = [row for row in rows if row["says"].startswith(says)]
    assert row["verdict"] == "fails", row


# (script, the start of the rule's "says", numbers that agree with the claim at the edge of its rule): each holds
AGREEING = [
    ("posemb", "a position row is like its four", {"own grid far corner": 0.03}),  # nearly unrelated is unlike
    ("posemb", "the 1D stretch is a disaster", {"2D bilinear of 1000": 22.24, "2D bicubic of 1000": 22.24,
                                                "1D of 1000": 2.24}),  # 20 below, to round-off
    ("fewshot", "the two representations", {"class token lambda 1 1-shot mean": 98.2}),  # 0.2 from 98.0 (round-off)
    ("finetune", "the weight average and the last", {"average accuracy": 99.37}),  # 0.2 below the last
]


@pytest.mark.parametrize("script,says,changed", AGREEING, ids=[f"{s}: {says}" for s, says, _ in AGREEING])
def test_numbers_that_agree_with_a_claim_at_the_edge_of_its_rule_make_it_hold(script, says, changed):
    rows = judge(script, article_numbers(script, **changed))[1]
    [row] = [row for row in rows if row["says"].startswith(says)]
    assert row["verdict"] == "holds", row


def test_every_rule_has_a_row_of_contradicting_numbers():
    named = {(script, says) for script, says, _ in CONTRADICTING}
    for script in SCRIPTS:
        for rule in rules_of(script):
            assert any(rule["says"].startswith(says) for s, says in named if s == script), rule["says"]


@pytest.mark.parametrize("rule,problem", [
    ({"says": "x", "article": "", "checks": [["no such number", "<", 1]]},
     "reads 'no such number', a number the script"),
    ({"says": "x", "article": "", "checks": [["ln 10", "above", 1]]}, "is not one of"),
    ({"says": "x", "article": "", "checks": [["ln 10", "within", 1]]}, "is not one of"),  # no tolerance
    ({"says": "x", "article": "", "checks": [["ln 10", "<"]]}, "is not one of"),
], ids=["an unknown number", "an unknown check", "a missing tolerance", "a missing side"])
def test_a_rule_file_that_is_wrong_is_refused_when_the_rules_load(rule, problem, tmp_path, monkeypatch):
    (tmp_path / "reference_finetune.json").write_text((verdicts.REFERENCE_DIR / "reference_finetune.json").read_text())
    (tmp_path / "conclusions_finetune.json").write_text(json.dumps({"conclusions": [rule]}))
    monkeypatch.setattr(verdicts, "REFERENCE_DIR", tmp_path)
    with pytest.raises(ValueError, match="conclusions_finetune.json: the rule 'x'") as refused:
        judge("finetune", {})
    assert problem in str(refused.value) and "\n" not in str(refused.value)


# ---------------------------------------------------------------- the checks, by hand

# [op, left interval, right interval, extra, verdict], worked out by hand
DECISIONS = [
    ("<", (1, 2), (3, 4), (), "holds"), ("<", (3, 4), (1, 2), (), "fails"), ("<", (1, 3), (2, 4), (), "undecided"),
    ("<", (2, 2), (2, 2), (), "fails"),  # equal is not below
    (">=", (5, 6), (5, 5), (-1,), "holds"), (">=", (3, 3.9), (5, 5), (-1,), "fails"),
    (">=", (3.5, 4.5), (5, 5), (-1,), "undecided"), (">=", (30, 40), (5, 8), (20,), "holds"),
    (">=", (20, 30), (5, 8), (20,), "undecided"),  # the gap is 12 to 25
    ("==", (0, 0), (0, 0), (), "holds"), ("==", (1e-9, 1e-9), (0, 0), (), "fails"),
    ("==", (0, 1), (0, 0), (), "undecided"), ("==", (-1, 0), (0, 0), (), "undecided"),
    ("within", (1, 1), (1.4, 1.4), (0.5,), "holds"), ("within", (1, 1), (1.6, 1.6), (0.5,), "fails"),
    ("within", (0.8, 1.2), (1.4, 1.4), (0.5,), "undecided"),  # the gap is 0.2 to 0.6
    ("within", (1, 1), (1.5, 1.5), (0.5,), "holds"), ("within", (0.9, 1), (1.5, 1.5), (0.5,), "undecided"),
    ("apart", (1, 1), (2, 2), (0.5,), "holds"), ("apart", (1, 1), (1.2, 1.2), (0.5,), "fails"),
    ("apart", (0.8, 1.2), (1.5, 1.5), (0.5,), "undecided"), ("apart", (2, 2), (1, 1), (0.5,), "holds"),
    ("times", (8, 8), (2, 2), (3.9, 4.1), "holds"), ("times", (9, 9), (2, 2), (3.9, 4.1), "fails"),
    ("times", (8, 8), (2, 2), (4.0, 4.1), "holds"), ("times", (8, 8), (2, 2), (3.9, 4.0), "holds"),
    ("times", (7, 9), (2, 2), (3.9, 4.1), "undecided"), ("times", (1, 1), (0, 0), (3.9, 4.1), "fails"),
    ("times", (-0.6, -0.6), (0.6, 0.6), (-1.01, -0.99), "holds"),
    # at the bounds: "at least", "apart" and "within" include them, "below" and a ratio's "fails" do not
    (">=", (5, 5), (4, 4), (1,), "holds"), (">=", (4, 5), (4, 4), (1,), "undecided"),
    ("apart", (1, 1), (1.5, 1.5), (0.5,), "holds"), ("apart", (1.5, 2), (2, 2), (0.5,), "undecided"),
    ("times", (3, 4), (2, 2), (2, 3), "undecided"), ("times", (6, 8), (2, 2), (2, 3), "undecided"),
    ("times", (3, 5), (2, 2), (2, 3), "undecided"), ("times", (5, 7), (2, 2), (2, 3), "undecided"),
    # a bound is met to round-off of the numbers' size, and no more: 98.2 - 98.0 computes to 0.2000000000000028
    ("within", (98.2, 98.2), (98.0, 98.0), (0.2,), "holds"), ("within", (98.21, 98.21), (98.0, 98.0), (0.2,), "fails"),
    (">=", (22.24, 22.24), (2.24, 2.24), (20,), "holds"), ("apart", (0.3, 0.3), (0.1, 0.1), (0.2,), "holds"),
    ("within", (2e-12, 2e-12), (0, 0), (1e-12,), "fails"), ("times", (0.3, 0.3), (0.1, 0.1), (3, 3), "holds"),
]


@pytest.mark.parametrize("op,left,right,extra,expected", DECISIONS)
def test_each_check_decides_as_worked_out_by_hand(op, left, right, extra, expected):
    assert decide(op, left, right, extra) == expected


@pytest.mark.parametrize("entry,value,expected", [
    ({"article": "34.9", "kind": "nothing"}, 34.8911, "same"),                  # rounds to the article's digits
    ({"article": "34.9", "kind": "nothing"}, 34.96, "differs"),
    ({"article": "1,035,645", "kind": "nothing"}, 1_035_646, "differs"),
    ({"article": "4.0e-04", "kind": "nothing"}, 4.04e-4, "same"),
    ({"article": "0.0", "kind": "nothing"}, -1e-9, "same"),                     # -0.0 prints as 0.0
    ({"article": "99.54", "kind": "weights", "band": 0.056}, 99.49, "close"),   # 2 pictures of 3,925
    ({"article": "99.54", "kind": "weights", "band": 0.056}, 99.44, "differs"),
    ({"article": "99.54", "kind": "weights"}, 99.49, "differs"),                # no band: close is not possible
    ({"article": "2.3014", "kind": "chance"}, 2.3014, "varies"),                # no measured spread: no claim
    ({"article": "98.0", "kind": "chance", "band": 0.65}, 97.5, "close"),
    ({"article": "98.0", "kind": "chance", "band": 0.65}, 97.3, "differs"),
    ({"article": "98.0", "kind": "chance", "band": 0.5}, 98.5, "close"),  # at the band's edge: inside it
])
def test_a_number_on_the_articles_setup_is_same_close_differs_or_varies(entry, value, expected):
    assert number_row("a number", entry, {"value": value}, {})["verdict"] == expected


def test_format_like_uses_the_articles_digits():
    assert [format_like("34.9", 34.8911), format_like("1,035,645", 1035645.4), format_like("4.0e-04", 4.04e-4),
            format_like("0.0", -0.0001)] == ["34.9", "1,035,645", "4.0e-04", "0.0"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_reference_entry_has_a_kind_and_bands_have_reasons(script):
    for name, entry in load_reference(script).items():
        assert entry["kind"] in ("nothing", "weights", "chance"), name  # docs/compare.md's kinds
        assert entry["kind"] != "nothing" or "band" not in entry, name  # arithmetic is same or differs
        assert "band" not in entry or entry.get("why"), name


# ---------------------------------------------------------------- a sample of the article's pictures

def sample(n, of=3925, flag="--per-class 20"):
    return {"validation pictures": {"flag": flag, "why": f"{flag}: {n:,} of {of:,}", "n": n, "of": of}}


def counted(script, n, **percents):
    """The article's numbers, the accuracies given counted on n pictures as a run records them."""
    numbers = article_numbers(script)
    for name, percent in percents.items():
        right = round(percent * n / 100)
        numbers[name] = {"value": 100 * right / n, "right": right, "of": n, "scale": 100}
    return numbers


def test_a_sampled_accuracy_is_close_differs_or_undecided_by_this_runs_exact_interval():
    """close: the whole interval inside the article's number and band; differs: clear of them; else undecided (on 10
    pictures nearly always: the interval spans tens of points)."""
    entry = {**load_reference("posemb")["2D bilinear of 10"], "band": 0.5}
    all_right = number_row("2D bilinear of 10", entry, {"value": 100.0, "right": 50, "of": 50}, sample(50))
    assert all_right["verdict"] == "undecided"
    assert all_right["interval"] == pytest.approx(list(accuracy_interval(50, 50, 3925)))
    nine_wrong = number_row("2D bilinear of 10", entry, {"value": 82.0, "right": 41, "of": 50}, sample(50))
    assert nine_wrong["verdict"] == "differs" and nine_wrong["interval"][1] < 99.69 - 0.5
    whole = number_row("2D bilinear of 10", entry, {"value": 99.7, "right": 3913, "of": 3925}, sample(3925, 3926))
    assert whole["verdict"] == "close" and 99.19 <= whole["interval"][0] <= whole["interval"][1] <= 100.19
    half = number_row("zeros of 10", load_reference("posemb")["zeros of 10"], {"value": 50.0, "right": 5, "of": 10},
                      sample(10))
    assert half["verdict"] == "undecided" and half["interval"][1] - half["interval"][0] > 50
    uncounted = number_row("2D bilinear of 10", entry, {"value": 100.0}, sample(50))  # no counts: no evidence
    assert uncounted["verdict"] == "not comparable"


SUBSETS = [  # (--per-class, drawn at random, the folder whole, pictures used, a sample of the release, why)
    (3, True, True, 30, True, "--per-class 3: 30 of 3,925 validation pictures (3 a class on average, drawn at random)"),
    (3, False, True, 30, False, "--per-class 3: 30 of 3,925 validation pictures (the first 3 of each class)"),
    (3, True, False, 30, False, ("--data-dir copy --per-class 3: 30 of 3,925 validation pictures (3 a class on "
                                 "average, drawn at random of a partial copy)")),
    (None, False, False, 30, False, "--data-dir copy: 30 of 3,925 validation pictures (a partial copy, not a draw)"),
    (None, False, True, 3930, False, "--data-dir copy: 3,930 of 3,925 validation pictures (more than the release)"),
    (None, False, True, 3925, False, None),
]


@pytest.mark.parametrize("per_class,drawn,whole,count,sample,why", SUBSETS)
def test_only_a_draw_the_project_made_from_a_whole_copy_is_a_sample(per_class, drawn, whole, count, sample, why):
    """A sample of the release is a draw the project made, by its seed, from the release or a whole copy: not the
    first N of each class, not a partial copy (the first files by name is the obvious way to make one, and a biased
    part), not a folder with more pictures than the release (judging it as one would be a count over its set)."""
    args = type("Args", (), {"per_class": per_class, "data_dir": "copy"})()
    differences = data_set.subset_differences(args, {"validation pictures": count}, {"validation pictures": 3925},
                                              drawn, whole)
    assert ("n" in differences.get("validation pictures", {})) is sample
    assert differences.get("validation pictures", {}).get("why") == why


def test_a_conclusion_on_sampled_accuracies_uses_their_intervals_together_and_names_the_pictures_that_decide_it():
    """posemb on 200 of 3,925 pictures: 2D at 84.76% against 224 at 83.13% less a point cannot be told apart. The
    rule reads three sampled numbers (two of them also against 75%): each interval at 1 - 0.05/3. The count named is
    the fewest at which every check is decided, and one fewer is not."""
    says = "the two 2D stretches keep"
    values = {"2D bilinear of 1000": 84.76, "2D bicubic of 1000": 84.97, "224 of 1000": 83.13}
    numbers = counted("posemb", 200, **values)
    row = next(row for row in judge("posemb", numbers, sample(200))[1] if row["says"].startswith(says))
    assert row["verdict"] == "undecided" and 200 < row["pictures"] < 3925
    assert set(row["intervals"]) == set(values) and set(row["reads"]) == set(values)
    level = 1 - 0.05 / 3

    def decided(n):  # the run's 200 pictures' shares, counted on n
        bounds = {name: accuracy_interval(round(numbers[name]["right"] * n / 200), n, 3925, level) for name in values}
        low_224, high_224 = bounds["224 of 1000"]
        return all((low >= high_224 - 1 or high < low_224 - 1) and (low >= 75 or high < 75)
                   for low, high in (bounds["2D bilinear of 1000"], bounds["2D bicubic of 1000"]))

    assert decided(row["pictures"]) and not decided(row["pictures"] - 1)
    assert row["intervals"]["224 of 1000"] == pytest.approx(list(accuracy_interval(166, 200, 3925, level)))


def test_on_the_whole_set_every_accuracy_is_exact_and_decides():
    numbers = counted("posemb", 3925, **{"2D bilinear of 1000": 84.76, "224 of 1000": 83.13})
    rows = judge("posemb", numbers)[1]
    assert all(row["verdict"] == "holds" for row in rows) and not any(row.get("intervals") for row in rows)


@pytest.mark.parametrize("script", ["posemb", "fewshot"])
def test_on_ten_pictures_no_rule_comparing_close_accuracies_is_decided(script):
    """On 10 of 3,925 pictures each accuracy's interval spans tens of points: no rule that compares accuracies that are
    close in the article (2D and 224, 1 and 5 shots, the lambdas, the representations) nor one that asks a level of
    them is decided; the rules that read no accuracy are decided as before."""
    reference = load_reference(script)
    sampled = {name for name, entry in reference.items() if entry.get("sample")}
    numbers = article_numbers(script)
    for name in sampled:
        numbers[name] = counted(script, 10, **{name: numbers[name]["value"]})[name]
    if script == "fewshot":  # a mean over 5 draws: each draw counted
        for name in sampled:
            numbers[name]["right"] = [numbers[name]["right"]] * 5
    for row, rule in zip(judge(script, numbers, sample(10, flag="--per-class 1"))[1], rules_of(script), strict=True):
        if not set(rule["reads"]) & sampled:  # decided as on the article's setup, or moved by the subset
            assert row["verdict"] in ("holds", "not comparable"), row
        elif rule["says"].startswith(("the 1D stretch", "with no position rows")):
            continue  # 36 and 34 points apart: 10 pictures can tell some of these
        else:
            assert row["verdict"] == "undecided" and row["pictures"] > 10, row


# ---------------------------------------------------------------- what the setup moves

def differences_of(*items):
    """Setup differences as the scripts record them: {item: {"flag", "why"}}, n of N pictures for a subset."""
    return {item: {"flag": flag, "why": f"{flag}: not the article's", **({"n": n, "of": of} if n else {})}
            for item, flag, n, of in items}


NC, HOLDS = "not comparable", "holds"
ANOTHER_MODEL = differences_of(("checkpoint", "--model other", 0, 0))
# [script, the run's setup differences, the article's numbers it never produced, each conclusion's verdict in order],
# worked out by hand from the numbers each conclusion reads and what moves them (data/reference_<script>.json, its
# inputs): a conclusion is decided only when every number it reads is comparable.
FLAGGED = [
    # setup: only the hybrid's 4 times longer sequence reads the ResNet-50 it loaded (microsoft/resnet-50 when cached)
    ("setup", differences_of(("checkpoint", "microsoft/resnet-50", 0, 0)), [], [HOLDS] * 5 + [NC] + [HOLDS] * 12),
    # posemb: the tiny grid, SciPy, the library, close not same, the corner row, the own grid's neighbours, the
    # stretched grid's, then the five on the accuracies
    ("posemb", differences_of(("resolution", "--resolution 512", 0, 0)), [], [HOLDS, NC, NC, NC, NC, HOLDS] + [NC] * 6),
    ("posemb", differences_of(("precision", "--precision bf16", 0, 0)), [], [HOLDS] * 7 + [NC] * 5),
    ("posemb", ANOTHER_MODEL, [], [HOLDS] + [NC] * 11),
    ("posemb", differences_of(("data set", "--data-dir other", 0, 0)), [], [HOLDS] * 7 + [NC] * 5),
    # few-shot: the hand example, the sign flip, four on the means, the tench's scores
    ("fewshot", differences_of(("resolution", "--resolution 384", 0, 0)), [], [HOLDS, HOLDS] + [NC] * 5),
    ("fewshot", differences_of(("draws", "--draws 2", 0, 0)), [], [HOLDS, HOLDS, NC, NC, NC, NC, HOLDS]),
    ("fewshot", differences_of(("training pictures", "--data-dir partial", 0, 0),
                               ("validation pictures", "--per-class 12", 120, 3925)), [], [HOLDS, HOLDS] + [NC] * 5),
    ("fewshot", ANOTHER_MODEL, [], [HOLDS, HOLDS] + [NC] * 5),
    # fine-tuning: ln 10, no gradient, the head's, step 1, the random head's scores and its gradient, after 5 steps
    # its accuracy and its loss, confident, clipping, the pass, the end
    ("finetune", differences_of(("resolution", "--resolution 32", 0, 0)), [], [HOLDS, HOLDS] + [NC] * 8 + [HOLDS, NC]),
    ("finetune", differences_of(("precision", "--precision bf16", 0, 0)), [], [HOLDS, HOLDS] + [NC] * 8 + [HOLDS, NC]),
    ("finetune", differences_of(("checked pictures", "--check-per-class 10", 0, 0)), [],
     [HOLDS] * 6 + [NC, HOLDS, NC] + [HOLDS] * 3),
    ("finetune", differences_of(("validation pictures", "--per-class 50", 500, 3925)), [],
     [HOLDS] * 6 + [NC, HOLDS, NC, HOLDS, HOLDS, NC]),
    ("finetune", {"steps": {"flag": "--steps 3", "why": "--steps 3", "removes": ["step 5 accuracy", "step 5 loss"]}},
     ["step 5 accuracy", "step 5 loss"], [HOLDS] * 6 + [NC] * 6),  # step 5 never logged: no "not run"
    ("finetune", ANOTHER_MODEL, [], [HOLDS, HOLDS] + [NC] * 8 + [HOLDS, NC]),
    # the backbone: the feature map, the checkpoint's name, before and after, the loss
    ("backbone", differences_of(("precision", "--precision bf16", 0, 0)), [], [HOLDS] * 2 + [NC, NC]),
    ("backbone", differences_of(("validation pictures", "--per-class 4", 12, 133)), [], [HOLDS] * 2 + [NC, NC]),
    ("backbone", ANOTHER_MODEL, [], [HOLDS, NC, NC, NC]),
]


@pytest.mark.parametrize("script,differences,never,expected", FLAGGED)
def test_a_conclusion_on_a_number_a_difference_moved_is_not_comparable_naming_it(script, differences, never, expected):
    numbers = {name: number for name, number in article_numbers(script).items() if name not in never}
    rows = judge(script, numbers, differences)[1]
    assert [row["verdict"] for row in rows] == expected
    flags = {difference["flag"] for difference in differences.values()}
    assert all(row["flags"] and set(row["flags"]) <= flags for row in rows if row["verdict"] == NC)


def test_a_number_not_run_makes_its_conclusion_not_run_before_any_flag():
    """A section that could not run leaves its numbers out: its conclusions are not run, whatever the flags."""
    numbers = article_numbers("finetune")
    del numbers["step 5 accuracy"]
    row = conclusion(judge("finetune", numbers, differences_of(("resolution", "--resolution 32", 0, 0)))[1],
                     "after 5 steps the accuracy")
    assert row["verdict"] == "not run" and "flags" not in row


def test_each_conclusion_carries_the_numbers_it_read():
    numbers = article_numbers("backbone", **{"after eval_accuracy": 0.5})
    row = conclusion(judge("backbone", numbers)[1], "fine-tuning takes the accuracy")
    assert row["verdict"] == "fails"
    assert row["reads"] == {"after eval_accuracy": 0.5, "before eval_accuracy": pytest.approx(0.3082706766917293)}


def test_the_lines_after_the_table_name_each_verdict_its_evidence_and_count_them():
    numbers = article_numbers("backbone", **{"after eval_accuracy": 0.5})
    rows, conclusions = judge("backbone", numbers)
    lines = verdicts.comparison_lines(rows, conclusions, {})
    start = lines.index("== the article's conclusions, decided by this run ==")
    [at] = [i for i, line in enumerate(lines) if line.startswith("  fails: fine-tuning takes the accuracy on beans")]
    assert at > start and lines[at + 1] == ("      this run: after eval_accuracy 0.5, before eval_accuracy "
                                            "0.3082706766917293")
    assert conclusion(conclusions, "fine-tuning takes")["evidence"] == lines[at + 1].removeprefix("      this run: ")
    assert lines[-1] == "  3 hold, 1 fail, 0 undecided, 0 not run, 0 not comparable (of 4 conclusions)"


def test_comparison_rows_carry_kind_difference_and_reason():
    reference = {"a": {"article": "34.9", "kind": "nothing"},
                 "b": {"article": "99.54", "kind": "weights", "band": 0.056, "why": "round-off"}}
    rows = [number_row(name, entry, {"b": {"value": 99.5, "text": "99.50"}}.get(name), {})
            for name, entry in reference.items()]
    assert rows[0]["verdict"] == "not run" and rows[0]["run"] is None
    assert rows[1]["verdict"] == "close" and rows[1]["why"] == "round-off"
    assert rows[1]["difference"] == pytest.approx(-0.04)


IMAGENETTE_VAL = (387, 395, 357, 386, 409, 394, 389, 419, 399, 390)  # each class's validation pictures, 3,925


def counts_covering(truth, n, total):
    """[first, last]: counts right of n pictures whose interval (accuracy_interval's own) holds the truth, a count of
    the whole set. Both bounds of the interval grow with the count, so every count between holds it too, and
    P(first <= X <= last) is at most the interval's coverage: at least 95% here is at least 95% there. Found from the
    one-sided tests' quantiles, moved inward until accuracy_interval holds the truth at both ends."""
    def covers(right):
        low, high = accuracy_interval(right, n, total)
        return low - 1e-9 <= 100 * truth / total <= high + 1e-9

    first, last = (int(q(0.025, total, truth, n)) for q in (hypergeom.ppf, hypergeom.isf))
    while not covers(first):
        first += 1
    while not covers(last):
        last -= 1
    return first, last


# per-class accuracies of Imagenette's validation classes: the article's 1D stretch of 10 (every class alike), and its
# no-position-rows row arranged the worst way for a draw of each class (whole classes right or wrong); near 100%, the
# coverage tests above take the article's 99.69%
PROFILES = {"92.00% alike": [0.92] * 10, "52.64%, whole classes right or wrong": [1, 1, 1, 1, 1, 0.3, 0, 0, 0, 0]}


@pytest.mark.parametrize("profile", PROFILES.values(), ids=PROFILES.keys())
def test_the_interval_of_a_per_class_draw_covers_the_whole_sets_accuracy_at_every_per_class(profile):
    """--per-class N draws N x 10 validation pictures from the whole split, a simple random sample whatever the classes'
    accuracies (common/data.py), so the count right is hypergeometric(3,925, K, n), K the whole set's count: the
    arrangement over the classes does not enter. Its coverage, computed exactly for every N from 1 to the whole split,
    is at least 95%."""
    truth, total = round(sum(a * size for a, size in zip(profile, IMAGENETTE_VAL, strict=True))), sum(IMAGENETTE_VAL)
    for per_class in range(1, -(-total // 10) + 1):
        n = min(10 * per_class, total)
        first, last = counts_covering(truth, n, total)
        covered = hypergeom.cdf(last, total, truth, n) - hypergeom.cdf(first - 1, total, truth, n)
        assert covered >= 0.95 - 1e-12, (per_class, covered)


# ---------------------------------------------------------------- a model of its own (the miniature)

def test_on_its_own_terms_a_run_is_judged_whatever_its_setup_each_count_a_draw_of_its_source():
    """own=True: the miniature's checkpoint, pictures and flags set nothing aside; a counted accuracy is a sample of
    independent pictures (Clopper-Pearson at 95% when it is the rule's one counted number); what was never produced is
    not run."""
    numbers = article_numbers("finetune")
    numbers["step 5 accuracy"] = {"value": 99.0, "right": 297, "of": 300}
    setup = {**ANOTHER_MODEL, **differences_of(("resolution", "--resolution 64", 0, 0))}
    rows = {row["says"][:30]: row for row in judge("finetune", numbers, setup, own=True)[1]}
    after_5 = rows["after 5 steps the accuracy has"]
    assert after_5["verdict"] == "holds"
    assert after_5["intervals"] == {"step 5 accuracy": pytest.approx(list(accuracy_interval(297, 300)))}
    low, high = accuracy_interval(297, 300)  # Clopper-Pearson's (held to the beta quantiles above)
    assert f"step 5 accuracy 99.0 [{low:.4g} to {high:.4g}]" in after_5["evidence"]
    against_the_article = {row["says"][:30]: row for row in judge("finetune", numbers, setup)[1]}
    assert against_the_article["after 5 steps the accuracy has"]["verdict"] == "not comparable"
    del numbers["step 0 validation"]
    assert {row["says"][:30]: row for row in judge("finetune", numbers, setup, own=True)[1]}[
        "after 5 steps the accuracy has"]["verdict"] == "not run"


def test_on_its_own_terms_an_undecided_conclusion_names_the_pictures_of_its_source_that_would_decide_it():
    numbers = article_numbers("finetune")
    numbers["step 5 accuracy"] = {"value": 98.0, "right": 49, "of": 50}  # [89.4, 99.9]: at least 97% cannot be told
    row = conclusion(judge("finetune", numbers, own=True)[1], "after 5 steps the accuracy")
    assert row["verdict"] == "undecided" and 50 < row["pictures"] < 1_000_000
    n = row["pictures"]
    assert accuracy_interval(round(49 * n / 50), n)[0] >= 97 > accuracy_interval(round(49 * (n - 1) / 50), n - 1)[0]


@pytest.mark.parametrize("percent,right,band,expected", [
    (98.0, 196, 0.5, "differs"), (100.0, 200, 0.5, "differs"),  # a point of the whole set, clear of the band
    (98.5, 197, 0.5, "close"), (99.5, 199, 0.5, "close"),  # at the band's edges: inside it
    (98.5, 197, None, "differs"),  # no band: only the article's number itself is close
])
def test_on_the_whole_set_a_counted_accuracy_is_a_point_judged_against_the_band(percent, right, band, expected):
    entry = {"article": "99.0", "kind": "weights", "sample": "validation pictures", **({"band": band} if band else {})}
    row = number_row("x", entry, {"value": percent, "right": right, "of": 200}, sample(200, 200))
    assert row["interval"] == [percent, percent] and row["verdict"] == expected


def test_an_interval_across_the_bands_edge_is_undecided_not_clear_of_it():
    """1,493 of 1,500 of 3,925 right: this run's interval, 99.16 to 99.75, reaches past the article's 99.0 + 0.5."""
    entry = {"article": "99.0", "kind": "weights", "sample": "validation pictures", "band": 0.5}
    row = number_row("x", entry, {"value": 99.53, "right": 1493, "of": 1500}, sample(1500))
    assert row["interval"][0] < 99.5 < row["interval"][1] and row["verdict"] == "undecided"
