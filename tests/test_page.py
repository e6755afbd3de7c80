"""job/page.py: the scripts' JSON files in, one page out, with every compared number and its figures."""
import hashlib
import json
import sys

import pytest
from conftest import compare
from PIL import Image

import figures
import vit_part3_setup
from common.start_and_end import UserError
from compare.verdicts import load_reference, verdict_text
from job import page as page_maker


@pytest.fixture(scope="module")
def four_runs(weight_runs, backbone_runs, tmp_path_factory):
    """A folder with the JSON of all five scripts: setup offline, the others on a random-weight stand-in."""
    folder = tmp_path_factory.mktemp("results")
    assert vit_part3_setup.main(["--json", str(folder / "setup.json")]) == 0
    for script in ("posemb", "fewshot", "finetune"):
        (folder / f"{script}.json").write_text(json.dumps(weight_runs[script][0]))
    (folder / "backbone.json").write_text(json.dumps(backbone_runs["records"][0]))
    return folder


def test_every_compared_number_is_on_the_page_with_its_verdict(four_runs):
    page = page_maker.build(four_runs, say=lambda text: None).read_text()
    for script in page_maker.SCRIPTS:
        record = json.loads((four_runs / f"{script}.json").read_text())
        rows = compare(record["numbers"], load_reference(script), record["setup differences"])
        assert len(rows) == len(load_reference(script)) > 40
        own = page.split(f"## {page_maker.script_file(script)}")[1].split("\n## ")[0].splitlines()  # its section
        for row in rows:
            line = next(text for text in own if text.startswith(f"| {page_maker.cell(row['name'])} |"))
            assert line.startswith(f"| {page_maker.cell(row['name'])} | {row['article']} | {row['run']} |"), row["name"]
            assert f"| {row['kind']} | {page_maker.cell(verdict_text(row))} |" in line
        assert f"## {page_maker.script_file(script)}" in page and record["environment"]["torch"] in page
    assert "220 same, 0 close, 0 differs, 0 undecided, 0 varies, 0 not comparable, 0 not run" in page  # setup offline
    assert "| vit_part3_setup.py | the article's |" in page
    assert "| vit_part3_posemb.py | a quick check, not the article's setup: --model " in page


def test_each_figure_is_a_png_that_opens(four_runs):
    pytest.importorskip("matplotlib")
    page = page_maker.build(four_runs, say=lambda text: None).read_text()
    names = ["posemb_cosine_similarity.png", "posemb_accuracy.png", "fewshot_accuracy.png", "finetune_curves.png",
             "backbone_curves.png", "backbone_feature_maps.png"]
    for name in names:
        assert f"(figures/{name})" in page
        with Image.open(four_runs / "figures" / name) as picture:
            picture.verify()
            assert picture.format == "PNG" and picture.size[0] > 300


def test_a_missing_script_is_listed_as_not_run(tmp_path):
    assert vit_part3_setup.main(["--json", str(tmp_path / "setup.json")]) == 0
    page = page_maker.build(tmp_path, say=lambda text: None).read_text()
    for script in ("posemb", "fewshot", "finetune"):
        assert f"Not run. `python vit_part3_{script}.py --json {tmp_path / f'{script}.json'}`" in page
    assert f"Not run. `python vit_backbone.py --json {tmp_path / 'backbone.json'}`" in page
    assert page.startswith("# The two articles' numbers, reproduced") and '"ViT as a backbone"' in page


def test_without_matplotlib_the_page_is_written_and_says_how_to_get_figures(four_runs, tmp_path, monkeypatch):
    for script in page_maker.SCRIPTS:
        (tmp_path / f"{script}.json").write_text((four_runs / f"{script}.json").read_text())
    with monkeypatch.context() as without:
        without.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
        said = []
        page = page_maker.build(tmp_path, say=said.append).read_text()
    assert "No figures: matplotlib is not installed (pip install matplotlib)" in page and "![" not in page
    assert not (tmp_path / "figures").exists() and any("without figures" in text for text in said)
    pytest.importorskip("matplotlib")  # installed afterwards: the page built again draws every figure from the JSON
    page = page_maker.build(tmp_path, say=said.append).read_text()
    assert len(list((tmp_path / "figures").glob("*.png"))) == page.count("](figures/") == 6


def test_a_figure_the_page_cannot_write_is_said_and_left_out(four_runs, tmp_path):
    """The page's figures/ holds a folder where fine-tuning's PNG goes: the page is written without that figure, and
    the line that says so reaches the one who built it (python -m job.page prints it, reproduce.py says it)."""
    pytest.importorskip("matplotlib")
    for script in page_maker.SCRIPTS:
        (tmp_path / f"{script}.json").write_text((four_runs / f"{script}.json").read_text())
    (tmp_path / "figures" / page_maker.finetune.FILE).mkdir(parents=True)
    said = []
    page = page_maker.build(tmp_path, say=said.append).read_text()
    assert f"figures/{page_maker.finetune.FILE}" not in page and page.count("](figures/") == 5
    assert [text for text in said if text.startswith("warning: ")] == [
        f"warning: cannot write the figure {tmp_path / 'figures' / page_maker.finetune.FILE}: Is a directory"]


@pytest.mark.parametrize("maps,error", [({"pictures": [], "before": [], "after": []}, "KeyError"),
                                        (["x"], "TypeError"),
                                        ({"pictures": [[1]], "before": [[1]], "after": [[1]], "labels": ["x"]},
                                         "TypeError")], ids=["no labels", "a list", "maps of one row"])
def test_figures_the_edited_series_of_a_record_cannot_draw_are_said_and_left_out(four_runs, tmp_path, maps, error):
    """A backbone.json whose feature maps were edited by hand (the verdicts never read them): the page keeps every
    number and leaves the backbone's figures off, in a line; it was a traceback and no page."""
    pytest.importorskip("matplotlib")
    for script in page_maker.SCRIPTS:
        (tmp_path / f"{script}.json").write_text((four_runs / f"{script}.json").read_text())
    record = json.loads((four_runs / "backbone.json").read_text())
    record["series"]["feature maps"] = maps
    (tmp_path / "backbone.json").write_text(json.dumps(record))
    said = []
    page = page_maker.build(tmp_path, say=said.append).read_text()
    assert page_maker.backbone.MAPS_FILE not in page and "## vit_backbone.py" in page
    warnings = [text for text in said if text.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"warning: the figures of backbone.json are left off the page: they cannot be drawn from its series ({error}: ")
    assert warnings[0].endswith("), which vit_backbone.py writes; run it again")


def test_a_paused_fine_tuning_and_a_backbone_without_logged_steps_still_have_their_figures(four_runs, monkeypatch):
    """A quick fine-tuning run pauses after step 5 and keeps its logged rows only; a backbone run too short to log
    a step has its feature maps."""
    pytest.importorskip("matplotlib")
    finetune = json.loads((four_runs / "finetune.json").read_text())
    finetune["series"] = {}
    finetune["numbers"] = {name: number for name, number in finetune["numbers"].items()
                           if name == "step 0 validation" or name.startswith("step 5 ")}
    drawn = {}
    def save(figure, folder, name, say):
        drawn[name] = figure
        return folder / name

    for module in (figures.backbone, figures.finetune):
        monkeypatch.setattr(module, "save", save)
    assert page_maker.draw_figures("finetune", finetune, [], four_runs, print) == [
        (page_maker.CAPTIONS["finetune_curves.png"], "finetune_curves.png")]
    panels = drawn["finetune_curves.png"].axes
    run_points = [len(axis.get_lines()[0].get_xdata()) for axis in panels]
    assert run_points == [1, 1, 1, 2]  # the step-5 row's loss, norm and LR; the accuracy at steps 0 and 5
    backbone = json.loads((four_runs / "backbone.json").read_text())
    backbone["series"] = {"training loss": [], "evaluation accuracy": [],
                          "feature maps": backbone["series"]["feature maps"]}
    assert [name for _, name in page_maker.draw_figures("backbone", backbone, [], four_runs, print)] == [
        "backbone_feature_maps.png"]


def test_the_page_says_first_when_numbers_come_from_stand_ins(four_runs, tmp_path):
    for script in ("setup", "posemb"):
        (tmp_path / f"{script}.json").write_text((four_runs / f"{script}.json").read_text())
    paragraphs = page_maker.build(tmp_path, say=lambda text: None).read_text().split("\n\n")
    assert paragraphs[1].startswith("**The numbers of vit_part3_posemb.py mean nothing**: it ran on generated "
                                    "stand-ins")
    (tmp_path / "posemb.json").unlink()
    assert "mean nothing" not in page_maker.build(tmp_path, say=lambda text: None).read_text()  # setup's are real


def test_a_script_the_job_could_not_run_says_why_and_the_jobs_command(tmp_path):
    (tmp_path / "reproduce.json").write_text(json.dumps({
        "command": "python reproduce.py results --quick",
        "not run": {"posemb": "google/vit-base-patch16-224 (346 MB) is not here and HF_HUB_OFFLINE=1 forbids "
                              "downloads: pass --models DIR (with DIR/google/vit-base-patch16-224/), "
                              "or run once online"}}))
    page = page_maker.build(tmp_path, say=lambda text: None).read_text()
    assert ("Not run: google/vit-base-patch16-224 (346 MB) is not here and HF_HUB_OFFLINE=1 forbids downloads: pass "
            "--models DIR (with DIR/google/vit-base-patch16-224/), or run once online. Then the job's command runs "
            "it: `python reproduce.py results --quick`") in page
    assert "Not run: no JSON in the folder. Then the job's command runs it: `python reproduce.py results --quick`" \
        in page  # setup: the job never said why (it was stopped before, say)


@pytest.mark.parametrize("job", [{"not run": ["posemb"]}, {"command": "python reproduce.py", "not run": {"posemb": 3}},
                                 {"setup": {"seconds": "12", "json": "{setup's}"}}])
def test_a_job_record_edited_into_another_type_is_read_as_no_jobs(tmp_path, job):
    """The page of a folder whose reproduce.json was edited by hand: each script's own command, and the script's own
    clock where the job's seconds are text, no traceback."""
    record = {"format": 1, "script": "setup", "numbers": {}, "environment": {"seconds": 7.5}}
    (tmp_path / "setup.json").write_text(json.dumps(record))
    recorded = hashlib.sha256((tmp_path / "setup.json").read_bytes()).hexdigest()
    (tmp_path / "reproduce.json").write_text(json.dumps(job).replace("{setup's}", recorded))
    page = page_maker.build(tmp_path, say=lambda text: None).read_text()
    assert f"Not run. `{page_maker.command('posemb', tmp_path)}`" in page and "| 7.5 s |" in page


def test_a_note_of_pictures_not_checked_is_a_line_under_the_articles_setup_not_a_difference(tmp_path):
    why = "--data-dir /copy: the release's layout and counts, its pictures not checked against the release"
    record = {"format": 1, "script": "posemb", "numbers": {},
              "setup differences": {"pictures unchecked": {"flag": "--data-dir /copy", "why": why, "moves": False,
                                                           "note": True}}}
    (tmp_path / "posemb.json").write_text(json.dumps(record))
    page = page_maker.build(tmp_path, say=lambda text: None).read_text()
    assert f"- setup: {page_maker.ARTICLE_SETUP}\n- note: {why}\n" in page
    assert "a quick check, not the article's setup" not in page


def test_the_flags_are_shown_as_a_user_types_them_with_paths_inside_the_folder_relative(tmp_path):
    flags = {"model": "/models/vit", "steps": 300, "shots": [1, 2], "resume": True, "no_cache": False,
             "pause_at": None, "save_dir": str(tmp_path / "finetune-run"), "plots": str(tmp_path / "figures"),
             "json": str(tmp_path / "finetune.json"), "compare": True, "data_dir": "/data/my nette"}
    assert page_maker.typed_flags(flags, tmp_path) == ("--model /models/vit --steps 300 --shots 1 2 --resume "
                                                       "--save-dir finetune-run --plots figures --data-dir "
                                                       "'/data/my nette'")


@pytest.mark.parametrize("content,refused", [(None, "is not a folder"), ("{not json", "is not a JSON file"),
                                             ('{"script": "setup"}', "was not written by")])
def test_a_bad_folder_or_file_is_one_line(tmp_path, content, refused):
    folder = tmp_path / "results"
    if content is not None:
        folder.mkdir()
        (folder / "setup.json").write_text(content)
    with pytest.raises(UserError, match=refused):
        page_maker.build(folder)


def test_each_figure_has_a_one_line_caption_under_it_and_the_backbones_says_it_is_the_articles_code(four_runs):
    pytest.importorskip("matplotlib")
    lines = page_maker.build(four_runs, say=lambda text: None).read_text().splitlines()
    shown = [k for k, text in enumerate(lines) if text.startswith("![")]
    assert len(shown) == 6
    for k in shown:
        assert lines[k + 1] == "" and lines[k + 2].startswith("*") and lines[k + 2].endswith("*"), lines[k:k + 3]
    captions = {lines[k].split("(figures/")[1].rstrip(")"): lines[k + 2] for k in shown}
    assert "the article's own figure code" in captions["backbone_curves.png"]


def test_the_columns_are_explained_under_each_table_in_the_words_of_compare_md(four_runs):
    """The kinds as docs/compare.md defines them, each with its examples, under every script's table."""
    import re

    from conftest import ROOT

    compare_md = (ROOT / "docs" / "compare.md").read_text().replace("\n", " ")
    kinds = re.findall(r"\*\*([a-z ]+)\*\* (\([^)]*\))", compare_md)
    assert [kind for kind, _ in kinds] == ["nothing", "the weights and the data", "chance as well"]
    lines = page_maker.build(four_runs, say=lambda text: None).read_text().splitlines()
    tables = [k for k, text in enumerate(lines) if text.startswith("| number | article | this run |")]
    assert len(tables) == 5
    for k in tables:
        end = next(j for j in range(k, len(lines)) if not lines[j].startswith("|"))
        under = lines[end + 1]
        assert under.startswith("kind: what the article's number depends on")
        for kind, examples in kinds:
            assert f"{kind} {examples[:-1]}" in under, kind
    summary_end = next(j for j in range(lines.index("| script | setup | verdicts | time |"), len(lines))
                       if not lines[j].startswith("|"))
    assert lines[summary_end + 1].startswith("Columns: setup") and "model loading included" in lines[summary_end + 1]


def test_the_page_shows_the_jobs_seconds_for_a_json_the_job_recorded_else_the_scripts_own(four_runs, tmp_path):
    import hashlib

    (tmp_path / "setup.json").write_text((four_runs / "setup.json").read_text())
    own = json.loads((tmp_path / "setup.json").read_text())["environment"]["seconds"]
    digest = hashlib.sha256((tmp_path / "setup.json").read_bytes()).hexdigest()
    for recorded, shown in ((digest, "7.8 s"), ("another file's digest", f"{own:.1f} s")):
        (tmp_path / "reproduce.json").write_text(json.dumps({"setup": {"json": recorded, "seconds": 7.8}}))
        page = page_maker.build(tmp_path, say=lambda text: None).read_text()
        assert f"| {shown} |" in page.split("| vit_part3_setup.py |", 1)[1].split("\n", 1)[0], recorded
        assert f", {shown}; commit" in page  # the environment line's time is the same


def test_the_few_shot_figure_on_the_page_names_the_runs_count_of_draws(monkeypatch, tmp_path):
    """The page draws from the record alone: the count of draws comes from its flags."""
    pytest.importorskip("matplotlib")
    caught = {}
    monkeypatch.setattr(figures.fewshot, "save", lambda figure, folder, name, say: caught.setdefault(name, figure)
                        and folder / name)
    record = {"numbers": {"pre-logits lambda 1 1-shot mean": {"value": 40.0}, "pre-logits lambda 1 1-shot std":
                          {"value": 1.0}}, "flags": {"draws": 3}}
    drawn = page_maker.draw_figures("fewshot", record, [], tmp_path, lambda text: None)
    assert drawn == [(page_maker.CAPTIONS[figures.fewshot.FILE], figures.fewshot.FILE)]
    title = caught[figures.fewshot.FILE].legends[0].get_title().get_text()
    assert "over 3 random draws of the training pictures" in title


def test_each_conclusion_on_the_page_shows_the_numbers_it_read(four_runs):
    """The page's first table: each conclusion's verdict beside the numbers it read, as the terminal prints them."""
    from compare.verdicts import judge

    page = page_maker.build(four_runs, say=lambda text: None).read_text()
    assert "| script | conclusion | verdict | this run's numbers | the article |" in page
    for script in page_maker.SCRIPTS:
        record = json.loads((four_runs / f"{script}.json").read_text())
        for row in judge(script, record["numbers"], record["setup differences"])[1]:
            assert (f"| `{page_maker.script_file(script)}` | {page_maker.cell(row['says'])} | "
                    f"{page_maker.cell(verdict_text(row))} | {page_maker.cell(row['evidence'])} |") in page
    assert "| holds | B/16 over B/32 compute at 224 4.06 |" in page  # setup's first, offline: the article's arithmetic


GOOD_NUMBER = {"value": 84.0, "text": "84.00", "right": 42, "of": 50}
# (what is wrong, the record's changed part, the refusal's words): each a record the scripts never write, which the
# verdicts would trip on; the page refuses it in one line, naming it
BAD_RECORDS = [
    ("numbers a list", {"numbers": []}, "its numbers or setup differences are not a mapping"),
    ("a number without value", {"numbers": {"224 of 10": {"text": "x"}}}, "the number '224 of 10' has no value"),
    ("counts of floats", {"numbers": {"224 of 10": {**GOOD_NUMBER, "right": 42.0}}}, "the counts of '224 of 10'"),
    ("more right than pictures", {"numbers": {"224 of 10": {**GOOD_NUMBER, "right": 51}}}, "the counts of"),
    ("no pictures", {"numbers": {"224 of 10": {**GOOD_NUMBER, "of": 0}}}, "the counts of"),
    ("no draws", {"numbers": {"224 of 10": {**GOOD_NUMBER, "right": []}}}, "the counts of"),
    ("a difference without flag", {"setup differences": {"resolution": {"why": "w"}}}, "has no flag and reason"),
    ("a sample over its set", {"setup differences": {"validation pictures": {"flag": "f", "why": "w", "n": 3930,
                                                                             "of": 3925}}}, "is not a sample of"),
    ("an older version's", {"format": None},
     "a record of another version of the scripts (no format, an older version's; this version reads format 1)"),
    ("a later version's", {"format": 2},
     "a record of another version of the scripts (format 2; this version reads format 1)"),
    ("another script's", {"script": "fewshot"}, "is a record of another script (fewshot; this name is posemb's)"),
    ("no script's", {"script": None}, "is a record of another script (none named; this name is posemb's)"),
    # edited into another type: each a traceback of python -m job.page before
    ("a section that could not run as text", {"could_not_run": ["x"]}, "its could_not_run is not a list of sections"),
    ("an environment as text", {"environment": "x"}, "its 'environment' is not a mapping"),
    ("flags as a list", {"flags": ["--compare"]}, "its 'flags' is not a mapping"),
    ("a --model as a number", {"flags": {"model": 5}}, "--model and --data-dir are not text"),
    ("seconds as text", {"environment": {"seconds": "12"}}, "its environment's seconds are not a number"),
]


@pytest.mark.parametrize("what,changed,said", BAD_RECORDS, ids=[what for what, _, _ in BAD_RECORDS])
def test_a_record_the_scripts_never_write_is_refused_in_one_line(what, changed, said, tmp_path):
    record = {"format": 1, "script": "posemb", "numbers": {"224 of 10": GOOD_NUMBER}, "setup differences": {},
              **changed}
    (tmp_path / "posemb.json").write_text(json.dumps({key: value for key, value in record.items()
                                                      if value is not None}))  # None: left out
    with pytest.raises(UserError) as refused:
        page_maker.build(tmp_path, say=lambda text: None)
    assert said in str(refused.value) and "run the script again" in str(refused.value)
    assert "\n" not in str(refused.value)
