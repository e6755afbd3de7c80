"""The comparison with the article: every logged number has a reference entry, every entry is produced
by its script, and no number that depends on the weights is called "same" or "close" by accident."""
import json
import re
from collections import Counter

import pytest
from conftest import ARTICLE, BACKBONE_ARTICLE, script_output

import vit_part3_setup
from compare.verdicts import load_reference

NUMBER = re.compile(r"[-+]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+]\d+)?")
# Numbers on the logged lines that name a thing rather than measure it: section numbers, model names, the
# settings a line states (steps, batch, lambda, shots, step and stage numbers), and the second side of AxB.
LABELS = [r"^(==|--) \d+[.b]", r"ViT-[BLH]/\d+", r"patch\d+-\d+", r"in21k", r"BatchNorm2d", r"set to 0",
          r"\b[A-Za-z]+-\d+[A-Za-z]*", r"Table \d+(: \d+M)?", r"\bat \d[\d,]*", r"\b[123]x[123]\b", r"\b[12]D\b",
          r"\b[AB][12]\b", r"order=1", r"\d+-class", r"(in|out)_features=\d+", r"step\s+\d[\d,]*",
          r"steps \d+ to \d+", r"(first|last) \d+ steps", r"of \d+ steps", r"[\d,]+ steps x batch 512",
          r"\d+ steps, batch \d+", r"batch \d+", r"momentum[ =]\d[\d.]*", r"base LR \S+", r"global norm \d\S*",
          r"factor of 0\.9999", r"factor \d\.\d+", r"decay to 0", r"ln\(\S+?\)", r"ln \d+ =", r"of the \d+ classes",
          r"= 0 because W_head = 0", r"std 0\.02", r"picture 1 range", r"stage \d", r"\bt=\d", r"\bg=\s*-?[\d.]+",
          r"\(ours [\d.]+\)", r"lr 0\.01", r"0\.9\*velocity", r"lambda\s*=?\s*[\d.]+", r"\d+-shot",
          r"\d+ random draws", r"pool of \d+", r"draw 0", r"K = \d", r"\d+ pictures, \d+ features", r"\[1, -1\]",
          r"\[-1, 1\]", r"\{-1, 1\}", r"\(X\^T X \+ I\)\^-1", r"right side of 0",
          r"4 channels, 2 pixels per channel, 2 groups", r"channel 1", r"channels 1 and 2", r"partner \d",
          r"group 1", r"filter \d", r"mean 0 and std 1", r"\(N\+1\)\^2", r"\)\^2", r"plus 1 \[class\]",
          r"\(1/2\)\^-2 = 4", r"1x1 patches", r"of \d+ numbers", r"\"4x longer", r"row \d+\b", r"\(0,0\)",
          r"position \d+ x \d+/\d+", r"\d+/\d+ = \d+ patches", r"bilinear \d+x\d+ -> \d+x\d+", r"at \d+ pixels",
          r"1 row for \[class\]", r"\d+ epochs", r"[\d.]+M images", r"warm-up 10,000", r"base LR [\d.]+",
          r"the last 1/\(1 - 0\.9999\)", r"sqrt\(9 \+ 0 \+ 16\)", r"> 1", r"by 1/5", r"tensors \[3, 0\] and \[4\]",
          r"length 1", r"global norm 1\b", r"over [\d,]+ training", r"\(\d+ px on the short side\)",
          r"\(\d+ patches\)", r"\b384, ", r"\b224, ", r"of 10\)", r"of 1000\)", r"\"of 1000\"", r"all 1000",
          r"the 10 Imagenette", r"the \d+ rows stretched", r"\(Eq\. 4\)", r"\(0\+1\)/2", r"\(0\+2\)/2",
          r"\(0\+1\+2\+3\)/4", r"grid 2x2", r"(?<=\d)x\d+"]


def logged_paragraphs():
    """(script, lines) of each logged block in the article: runs of lines that start '== ', '-- ' or '  '."""
    owners = {"== 0. data": "finetune", "== 1. step 0": "finetune", "== 2. fine-tuning": "finetune",
              "== 1. resize": "posemb", "== 2. the position table": "posemb", "== 4. accuracy": "posemb",
              "== 1. the closed form": "fewshot", "== 2. frozen": "fewshot"}
    paragraphs, current = [], []
    for text in ARTICLE.read_text().splitlines() + [""]:
        if text.strip():
            current.append(text)
            continue
        if current and current[0].startswith(("== ", "-- ", "  ")):
            owner = next((script for start, script in owners.items() if current[0].startswith(start)), "setup")
            paragraphs.append((owner, current))
        current = []
    return paragraphs


def measured_tokens(text):
    for label in LABELS:
        text = re.sub(label, " ", text)
    return [token.lstrip("+-") for token in NUMBER.findall(text)]


@pytest.mark.skipif(not ARTICLE.exists(), reason="the article is not beside the checkout")
@pytest.mark.parametrize("script", ["setup", "posemb", "fewshot", "finetune"])
def test_every_number_on_a_logged_line_has_a_reference_entry(script):
    on_lines = Counter(token for owner, lines in logged_paragraphs() if owner == script
                       for text in lines for token in measured_tokens(text))
    entries = Counter(entry["article"].lstrip("+-") for entry in load_reference(script).values())
    assert sum(on_lines.values()) > 40
    assert on_lines - entries == Counter()


# ---------------------------------------------------------------- the scripts on stand-ins

def test_setup_offline_produces_every_reference_number_and_all_are_same(tmp_path, capsys):
    status, _, err = script_output(vit_part3_setup.main, ["--compare", "--json", str(tmp_path / "s.json")], capsys)
    assert status == 0, err
    record = json.loads((tmp_path / "s.json").read_text())
    assert set(load_reference("setup")) <= set(record["numbers"])
    assert {row["verdict"] for row in record["comparison"]} == {"same"}


@pytest.mark.parametrize("script", ["posemb", "fewshot", "finetune"])
def test_every_reference_number_is_produced_on_stand_ins(weight_runs, script):
    for record in weight_runs[script]:
        assert sorted(set(load_reference(script)) - set(record["numbers"])) == []
        assert "not run" not in {row["verdict"] for row in record["comparison"]}


@pytest.mark.parametrize("script", ["posemb", "fewshot", "finetune"])
def test_no_number_that_moves_with_the_weights_is_called_same_or_close(weight_runs, script):
    first, second = weight_runs[script]
    moved = {name for name, number in first["numbers"].items() if number["value"] != second["numbers"][name]["value"]}
    assert len(moved) > 10
    for record in (first, second):
        claimed = {row["name"] for row in record["comparison"] if row["verdict"] in ("same", "close")}
        assert sorted(claimed & moved) == []
    # a stand-in is not the article's checkpoint, nor its pictures: what depends on them is not comparable, named
    for row in first["comparison"]:
        if row["name"] in moved:
            assert row["verdict"] == "not comparable" and "interval" not in row, row
            assert f"--model {first['flags']['model']}" in row["flags"], row


def test_on_the_stand_ins_no_conclusion_that_reads_a_number_of_the_weights_is_decided(weight_runs, backbone_runs):
    """Random weights and generated pictures decide nothing the articles claim of the released checkpoints and
    data: every conclusion that reads a number of kind weights or chance is not comparable, naming --model or
    --data-dir."""
    from compare.verdicts import judge

    records = [(script, record) for script, both in weight_runs.items() for record in both]
    records += [("backbone", record) for record in backbone_runs["records"]]
    for script, record in records:
        reference = load_reference(script)
        rows = judge(script, record["numbers"], record["setup differences"])[1]
        for row in rows:
            if any(reference[name]["kind"] != "nothing" for name in row["reads"]):
                assert row["verdict"] == "not comparable", (script, row)
                given = {f"--model {record['flags']['model']}", f"--data-dir {record['flags']['data_dir']}"}
                assert given & set(row["flags"]), (script, row)
        assert record["conclusions"] == rows  # what --json kept is what the page judges again


def test_json_holds_the_comparison_and_the_run(weight_runs):
    record = weight_runs["posemb"][0]
    row = next(row for row in record["comparison"] if row["name"] == "224 of 10")
    assert set(row) >= {"article", "run", "value", "kind", "verdict", "band", "why"}
    assert record["flags"]["batch_size"] == 16 and record["environment"]["torch"]
    accuracy = record["numbers"]["224 of 10"]["value"]
    assert any(f"accuracy {accuracy:.2f}% (of 10)" in line for line in record["printed"])  # recorded as printed


# ---------------------------------------------------------------- the second article, "ViT as a backbone"

# Its logged output follows the code on the same line of the text; these are the fragments it prints, and the
# rows of its table of configurations. "PyTorch version: 2.11.0+cu128" is the environment, not a result.
BACKBONE_LOGGED = [r"(?:Patch tokens|Feature map) shape: torch\.Size\(\[[\d, ]+\]\)",
                   (r"(?:Image size|Patch size|Hidden size|Number of hidden layers|Number of attention heads|"
                    r"Intermediate size): \d+"),
                   r"\{'eval_loss': [\d.e-]+, 'eval_accuracy': [\d.e-]+\}"]


def backbone_logged_numbers():
    text = BACKBONE_ARTICLE.read_text()
    fragments = [found for pattern in BACKBONE_LOGGED for found in re.findall(pattern, text)]
    for row in re.findall(r"^\| google/vit-.*$", text, flags=re.MULTILINE):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        fragments.append(" ".join(cells[1:7]))  # the name and the prose at the end are labels
    return Counter(token for fragment in fragments for token in NUMBER.findall(fragment)), len(fragments)


@pytest.mark.skipif(not BACKBONE_ARTICLE.exists(), reason="the article is not beside the checkout")
def test_every_number_the_backbone_article_logs_has_a_reference_entry():
    on_lines, fragments = backbone_logged_numbers()
    assert fragments == 2 + 6 + 2 + 4 and sum(on_lines.values()) == 7 + 6 + 4 + 4 * 6
    entries = Counter(entry["article"] for entry in load_reference("backbone").values())
    assert on_lines - entries == Counter()


def test_every_backbone_reference_number_is_produced_on_stand_ins(backbone_runs):
    for record in backbone_runs["records"]:
        assert sorted(set(load_reference("backbone")) - set(record["numbers"])) == []
        assert "not run" not in {row["verdict"] for row in record["comparison"]}


def test_no_backbone_number_that_moves_with_the_weights_is_called_same_or_close(backbone_runs):
    first, _, second = backbone_runs["records"]
    moved = {name for name, number in first["numbers"].items() if number["value"] != second["numbers"][name]["value"]}
    assert len(moved) > 10 and {"before eval_loss", "after eval_loss"} <= moved
    for record in (first, second):
        claimed = {row["name"] for row in record["comparison"] if row["verdict"] in ("same", "close")}
        assert sorted(claimed & moved) == []


def test_the_part_3_scripts_record_strict_float32(weight_runs):
    """Part 3's article ran on Apple's mps, which has no TF32: its scripts' fp32 is strict (the backbone's: torch's
    defaults, tests/test_backbone.py)."""
    for script, records in weight_runs.items():
        assert records[0]["environment"]["float32"]["rule"] == "strict", script


def test_every_pass_over_pictures_carries_its_wait_in_its_line_and_the_json(weight_runs, backbone_runs):
    """Each pass: its seconds, the part of them the model waited for pictures, its pictures, on its printed line
    (the number named "<pass> waiting seconds") and in --json's passes."""
    records = {**{script: runs[0] for script, runs in weight_runs.items()}, "backbone": backbone_runs["records"][0]}
    for script, record in records.items():
        assert record["passes"], script
        for name, timing in record["passes"].items():
            assert 0 <= timing["waiting seconds"] <= timing["seconds"] and timing["pictures"] > 0, (script, name)
            waited = record["numbers"][f"{name} waiting seconds"]
            assert waited["value"] == timing["waiting seconds"]
            assert any(f"{waited['value']:.1f} s waiting for pictures]" in line for line in record["printed"])
    flags, finetune = records["finetune"]["flags"], records["finetune"]["passes"]
    assert finetune["training"]["pictures"] == flags["steps"] * flags["batch_size"]
    validation = records["posemb"]["numbers"]["validation pictures"]["value"]
    assert [timing["pictures"] for timing in records["posemb"]["passes"].values()] == [validation] * 5
