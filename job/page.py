"""A reproduction report: the five scripts against the two articles on one page, with figures and the environment.

    python vit_part3_setup.py --json results/setup.json
    python vit_part3_posemb.py --json results/posemb.json
    python vit_part3_fewshot.py --json results/fewshot.json
    python vit_part3_finetune.py --json results/finetune.json
    python vit_backbone.py --json results/backbone.json
    python -m job.page results        # in the checkout: writes results/report.md, its figures in results/figures/
    python ~/vit-part3/job/page.py results    # the same from anywhere

The first four reproduce "ViT, explained · Part 3", the fifth the companion article "ViT as a backbone".

The page compares each run's numbers with the article's again (data/reference_<script>.json), with
the verdicts of --compare, so the runs need not have used --compare, and draws every figure from the
JSON records (matplotlib, part of the set-up; without it the page says how to get them, and building
it again draws them, no script run again). A script with no JSON in the folder is listed as not run:
with why and the job's command when reproduce.py made the folder (its reproduce.json), else with the
script's command. Paths inside the folder are written relative to it. A run on generated stand-ins
(job/standins.py) is named first: its numbers mean nothing.
"""
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

# run as a file from anywhere: the repository root is where common/, figures/ and job/ are found
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import figures
from common.data import DEFAULT_NAME as IMAGENETTE
from common.files import write_text
from common.paths import BEANS
from common.run import script_parser
from common.start_and_end import UserError, guarded
from compare.marks import MINIATURE_MARK, STANDIN_MADE
from compare.record import LIBRARIES, RECORD_FORMAT
from compare.verdicts import LEGEND, article_values, counts_text, judge, split_notes, verdict_text
from figures import backbone, fewshot, finetune, posemb
from job.scripts import SCRIPTS, script_file
from job.time_estimate import clock

JOB_RECORD = "reproduce.json"  # what reproduce.py ran into the folder, and why a script did not run
ARTICLE_SETUP = "the article's"  # the setup cell of a run whose setup is the article's
TIME = ("wall time of its process as reproduce.py measured it, model loading included (of fine-tuning resumed after "
        "a stop, its processes' together)")
COLUMNS = ("Columns: setup, the article's or the flags that make this run another (docs/compare.md); verdicts, the "
           f"count of each; time, the {TIME} (the terminal's and reproduce.json's seconds), or without reproduce.py "
           "the script's own clock.")
KINDS = ("kind: what the article's number depends on: nothing (arithmetic, the by-hand examples, learning rates, ln "
         "10; only ever same or differs), the weights and the data (evaluation accuracies, position-table statistics, "
         "the zero-head gradients), or chance as well (few-shot draws, training losses and gradient norms, round-off, "
         "timings). band and reason: how far the number may be from the article's and why, from its reference entry.")


def read_record(path):
    """The JSON a script wrote with --json, or None when there is none (or a folder or a pipe, which reproduce.py
    refuses: a pipe's reading would wait for ever)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"{path} is not a JSON file that a script wrote ({error}): run the script again") from error
    if not isinstance(record, dict) or "numbers" not in record:
        raise UserError(f"{path} was not written by the --json of vit_part3_*.py or vit_backbone.py: "
                        "run the script again")
    if record.get("format") != RECORD_FORMAT:
        found = f"format {record['format']}" if "format" in record else "no format, an older version's"
        raise UserError(f"{path} is a record of another version of the scripts ({found}; this version reads format "
                        f"{RECORD_FORMAT}): run the script again")
    if record.get("script") != path.stem:  # another script's numbers, shared names included, judged as this one's
        raise UserError(f"{path} is a record of another script ({record.get('script', 'none named')}; this name is "
                        f"{path.stem}'s): run the script again")
    problem = unlike_a_record(record)
    if problem:
        raise UserError(f"{path} is not a record a script wrote ({problem}): run the script again")
    return record


RECORD_PARTS = {"environment": dict, "flags": dict, "series": dict, "passes": dict, "could_not_run": list,
                "stand-ins": list, "printed": list}  # {part: its type} where the page and the job read it


def unlike_a_record(record):
    """What in a --json record is not as the scripts write it, in the parts the verdicts read, or None."""
    numbers, differences = record["numbers"], record.get("setup differences", {})
    if not isinstance(numbers, dict) or not isinstance(differences, dict):
        return "its numbers or setup differences are not a mapping"
    if part := next((part for part, kind in RECORD_PARTS.items() if not isinstance(record.get(part, kind()), kind)),
                    None):
        return f"its {part!r} is not a {'mapping' if RECORD_PARTS[part] is dict else 'list'}"
    paths = (record.get("flags", {}).get(flag) or "" for flag in ("model", "data_dir"))
    if not all(isinstance(text, str) for text in (*record.get("printed", []), *record.get("stand-ins", []), *paths)):
        return "its printed lines, stand-ins or --model and --data-dir are not text"
    if not all(isinstance(problem, dict) and isinstance(problem.get("section"), str) and isinstance(
            problem.get("why"), str) for problem in record.get("could_not_run", [])):
        return "its could_not_run is not a list of sections and reasons"
    if not isinstance(record.get("environment", {}).get("seconds", 0), (int, float)):
        return "its environment's seconds are not a number"
    for name, number in numbers.items():
        if not isinstance(number, dict) or not isinstance(number.get("value"), (int, float)):
            return f"the number {name!r} has no value"
        if "right" in number:
            rights, of = number["right"] if isinstance(number["right"], list) else [number["right"]], number.get("of")
            if not (isinstance(of, int) and of > 0 and rights and all(isinstance(right, int) and 0 <= right <= of
                                                                        for right in rights)):
                return f"the counts of {name!r} are not a count right of a number of pictures"
    for item, difference in differences.items():
        if not (isinstance(difference, dict) and isinstance(difference.get("flag"), str)
                and isinstance(difference.get("why"), str)):
            return f"the setup difference {item!r} has no flag and reason"
        if "n" in difference and not (isinstance(difference["n"], int) and isinstance(difference.get("of"), int)
                                      and 0 < difference["n"] <= difference["of"]):
            return f"the setup difference {item!r} is not a sample of its pictures"
    return None


def command(script, folder):
    return f"python {script_file(script)} --json {folder / f'{script}.json'}"


def cell(text):
    """Text for a Markdown table cell: a | inside a name would end the cell."""
    return str(text).replace("|", "\\|")


# Each figure's one-line caption on the page: what it shows, so that a reader needs no code to read it.
CAPTIONS = {
    posemb.COSINE_FILE: ("Cosine similarity of one position's row of the table with every row, on the "
                         "checkpoint's grid and on the stretched one: each panel's title names the "
                         "position, its axes are grid positions."),
    posemb.ACCURACY_FILE: ("Accuracy of the five versions of the position table, of the 10 Imagenette classes and of "
                           "all 1000: this run's bars with their values, the article's as crosses where this run's "
                           "are comparable."),
    fewshot.FILE: ("Few-shot accuracy against pictures per class (a log axis), a panel per representation: this "
                   "run's line and, where comparable, the article's points (a marker of its own) in one colour per "
                   "lambda, each lambda's points set a little apart along x so that equal ones stay seen; a point is "
                   "the mean over the random draws of the training pictures, its bar +- 1 standard deviation over "
                   "them."),
    finetune.FILE: ("The fine-tuning run against step, on this run's own steps: loss, gradient norm with the "
                    "clipping threshold, learning rate, validation accuracy, one legend below the four; the article's "
                    "logged steps as crosses where this run reached them and its setup makes them comparable."),
    backbone.CURVES_FILE: ("Drawn by the article's own figure code from this run's numbers (the article titled it "
                           "\"ViT Training Loss Curve\"; it shows accuracy too): against step, the left y axis is "
                           "the training loss (cross-entropy in nats, the mean of the steps since the last logged "
                           "one), the right y axis the evaluation accuracy (a fraction from 0 to 1 of the validation "
                           "pictures)."),
    backbone.MAPS_FILE: ("Each picture beside its patch tokens on their first three principal components as "
                         "RGB, before and after fine-tuning."),
}


def draw_figures(script, record, rows, folder, say):
    """The script's figures as PNGs in folder/figures; [(caption, file name)] of those saved. The article's numbers
    are marked only where this run's are comparable with them (rows: the comparison)."""
    values = {name: number["value"] for name, number in record["numbers"].items()}
    other = {row["name"] for row in rows if row["verdict"] == "not comparable"}
    article = {name: value for name, value in article_values(script).items() if name not in other}
    series, flags = record.get("series", {}), record.get("flags", {})
    out = folder / "figures"
    data = flags.get("data_dir") or (BEANS if script == "backbone" else IMAGENETTE)
    made = STANDIN_MADE if record.get("stand-ins") else None  # the script's own words, its folders perhaps gone
    origin = inside(figures.provenance(flags.get("model"), data, made), folder)
    drawn = []
    if script == "posemb":
        if series.get("cosine maps"):
            drawn.append(posemb.cosine_maps(series["cosine maps"], out, say, origin))
        if posemb.accuracy_rows(values):
            drawn.append(posemb.accuracy_bars(values, article, out, say, origin))
    elif script == "fewshot" and fewshot.fewshot_cells(values):
        drawn.append(fewshot.fewshot_accuracy(values, article, out, say, flags.get("draws"), origin))
    elif script == "finetune" and (series.get("training loss") or "step 0 validation" in values):
        drawn.append(finetune.finetune_curves(series, values, article, out, say, origin))
    elif script == "backbone":
        if series.get("training loss") or series.get("evaluation accuracy"):
            drawn.append(backbone.backbone_curves(series, out, say, origin))
        if series.get("feature maps"):
            drawn.append(backbone.backbone_feature_maps(series["feature maps"], out, say, origin))
    return [(CAPTIONS[path.name], path.name) for path in drawn if path is not None]


def setup_cell(differences):
    """The article's setup, or a quick check: the flags that made it another setup."""
    differences = split_notes(differences)[0]
    if not differences:
        return ARTICLE_SETUP
    flags = ", ".join(dict.fromkeys(difference["flag"] for difference in differences.values()))
    return f"a quick check, not the article's setup: {flags}"


def inside(text, folder):
    """text with the folder's own path left out of the paths inside it: the page reads the same when moved."""
    return str(text).replace(f"{Path(folder).resolve()}{os.sep}", "")


def typed_flags(flags, folder):
    """The run's flags as a user types them: a switch alone, a list as its values, paths inside folder relative."""
    tokens = []
    for key, value in flags.items():
        if value in (None, False) or key in ("compare", "json"):
            continue
        tokens.append(f"--{key.replace('_', '-')}")
        if value is not True:
            tokens += [inside(item, folder) for item in (value if isinstance(value, list) else [value])]
    return shlex.join(tokens)


def run_seconds(script, record, job, folder):
    """The script's time as text: reproduce.py's clock when it recorded this JSON, else the script's own."""
    entry, path = job.get(script), folder / f"{script}.json"
    if (isinstance(entry, dict) and isinstance(entry.get("seconds"), (int, float))
            and entry.get("json") == hashlib.sha256(path.read_bytes()).hexdigest()):
        return clock(entry["seconds"])
    seconds = record.get("environment", {}).get("seconds")
    return "?" if seconds is None else clock(seconds)


def environment_lines(record, folder, seconds):
    env = record.get("environment", {})
    versions = ", ".join(f"{name} {env[name]}" for name in ("python", *LIBRARIES) if env.get(name))
    shown = typed_flags(record.get("flags", {}), folder)
    return [f"- run: started {env.get('started', '?')}, {seconds}; commit {env.get('commit') or '?'}",
            (f"- {env.get('device', '?')}; precision {env.get('precision', '?')}; seed {env.get('seed', '-')}; "
             f"processes {env.get('processes', 1)}"),
            f"- {versions}", f"- flags: `{shown or '(defaults)'}`"]


def script_section(script, record, rows, drawn, folder, seconds):
    """The Markdown of one script: environment, verdict counts, figures, and every compared number."""
    lines = [f"## {script_file(script)}", "", f"Article: \"{SCRIPTS[script]['article']}\"", ""]
    if record.get("stand-ins"):
        given = ", ".join(inside(path, folder) for path in record["stand-ins"])
        lines += [f"Run on generated stand-ins ({given}): its numbers mean nothing.", ""]
    lines += environment_lines(record, folder, seconds)
    differences, notes = split_notes(record.get("setup differences", {}))
    if differences:
        lines.append("- setup: not the article's, so the numbers that depend on these are not comparable (or, for an "
                     "accuracy on a subset, judged by the interval the subset's size implies):")
        lines += [f"  - {difference['why']}" for difference in differences.values()]
    else:
        lines.append(f"- setup: {ARTICLE_SETUP}")
    lines += [f"- note: {why}" for why in notes]
    for problem in record.get("could_not_run", []):
        lines.append(f"- could not run section \"{problem['section']}\": {inside(problem['why'], folder)}")
    lines += ["", "Verdicts: " + counts_text(rows), ""]
    for title, name in drawn:
        lines += [f"![{title}](figures/{name})", "", f"*{title}*", ""]
    lines += ["| number | article | this run | difference | kind | verdict | band and reason |",
              "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for row in rows:
        difference = "" if row["difference"] is None else f"{row['difference']:+.3g}"
        reason = (f"±{row['band']:g}: {row['why']}" if "band" in row and row["verdict"] != "not comparable"
                  else row.get("why", ""))
        lines.append(f"| {cell(row['name'])} | {row['article']} | {row['run'] or '-'} | {difference} | "
                     f"{row['kind']} | {cell(verdict_text(row))} | {cell(reason)} |")
    return lines + ["", KINDS, ""]


def read_job(folder):
    """What reproduce.py recorded in the folder ({} when it did not make it, or the file cannot be read)."""
    try:
        job = json.loads((folder / JOB_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(job, dict) or not isinstance(job.get("not run", {}), dict) or not all(
            isinstance(why, str) for why in job.get("not run", {}).values()):  # edited by hand: read as no job's
        return {}
    return job


def not_run(script, folder, job):
    """(summary cell, paragraph) of a script with no JSON: why, when the job said, and the command that runs it."""
    why = job.get("not run", {}).get(script)
    if job.get("command"):
        paragraph = f"Not run: {why or 'no JSON in the folder'}. Then the job's command runs it: `{job['command']}`"
        return f"not run: {cell(why or 'no JSON')}", paragraph
    return f"not run: `{command(script, folder)}`", f"Not run. `{command(script, folder)}`"


def on_the_miniature(records):
    """The scripts whose model or data job/miniature.py made (its mark is in the folder they came from)."""
    return [script_file(script) for script, record in records.items()
            if record and any(ran_on and (Path(ran_on) / MINIATURE_MARK).is_file()
                              for ran_on in map(record.get("flags", {}).get, ("model", "data_dir")))]


def on_standins(records):
    """The scripts whose model or data job/standins.py made (their records name the folders)."""
    return [script_file(script) for script, record in records.items() if record and record.get("stand-ins")]


def build(folder, say=print):
    """report.md in folder from the scripts' JSON files there; returns its path. say: what the page lacks (figures
    without matplotlib, a figure that cannot be written)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: pass the folder the scripts wrote their --json files into")
    records, job = {script: read_record(folder / f"{script}.json") for script in SCRIPTS}, read_job(folder)
    with_figures = figures.pyplot(lambda text: None) is not None
    if not with_figures:
        say(f"report: {figures.INSTALL_HINT}; the page is written without figures")
    summary = ["| script | setup | verdicts | time |", "| --- | --- | --- | --- |"]
    decided = [("The articles' conclusions, decided by this run (how: the project's docs/compare.md, \"The "
                "conclusions\"; [a to b]: a sampled number's exact interval, those of one conclusion holding together "
                "with 95%):"), "",
               "| script | conclusion | verdict | this run's numbers | the article |",
               "| --- | --- | --- | --- | --- |"]
    body = []
    for script in SCRIPTS:
        record = records[script]
        if record is None:
            decided += [f"| `{script_file(script)}` | {cell(row['says'])} | not run | | {cell(row['article'])} |"
                        for row in judge(script, {})[1]]
            short, paragraph = not_run(script, folder, job)
            summary.append(f"| {script_file(script)} | | {short} | |")
            body += [f"## {script_file(script)}", "", paragraph, ""]
            continue
        differences = record.get("setup differences", {})
        rows, conclusions = judge(script, record["numbers"], differences)
        if on_the_miniature({script: record}):  # judged on its own numbers too, as the articles' claims of it
            own = judge(script, record["numbers"], differences, own=True)[1]
            conclusions = [{**row, "verdict text": f"{verdict_text(row)}; on the miniature: {verdict_text(mine)}",
                            "evidence": mine["evidence"]} for row, mine in zip(conclusions, own, strict=True)]
        decided += [f"| `{script_file(script)}` | {cell(row['says'])} | "
                    f"{cell(row.get('verdict text', verdict_text(row)))}"
                    f" | {cell(row['evidence'])} | {cell(row['article'])} |" for row in conclusions]
        seconds = run_seconds(script, record, job, folder)
        summary.append(f"| {script_file(script)} | {cell(setup_cell(differences))} | {counts_text(rows)} | "
                       f"{seconds} |")
        try:  # its series, which no verdict reads, edited by hand into what the figures cannot draw: left off
            drawn = draw_figures(script, record, rows, folder, say if with_figures else lambda text: None)  # warnings
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            say(f"warning: the figures of {script}.json are left off the page: they cannot be drawn from its series "
                f"({type(error).__name__}: {str(error)[:80]}), which {script_file(script)} writes; run it again")
            drawn = []
        body += script_section(script, record, rows, drawn, folder, seconds)
    head = ["# The two articles' numbers, reproduced", "", *what_ran(records)]
    head += [*decided, ""]  # first: what the run decides of the articles' conclusions, then the numbers
    head += ["Each number of the logged lines of \"ViT, explained · Part 3\" (the vit_part3_* scripts) and of \"ViT "
             "as a backbone\" (vit_backbone.py) beside this run's. " + LEGEND + ". Paths are relative to this "
             "folder.", ""]
    if not with_figures:
        head += [(f"No figures: {figures.INSTALL_HINT}; run `python -m job.page {folder}` again after "
                  f"installing it."), ""]
    return write_text(folder / "report.md", "\n".join(head + summary + ["", COLUMNS, ""] + body), what="report")


def what_ran(records):
    """The page's first paragraphs when its numbers are not of the articles' checkpoints and data."""
    lines = []
    if standins := on_standins(records):
        lines += [(f"**The numbers of {', '.join(standins)} mean nothing**: {'it' if len(standins) == 1 else 'they'} "
                   f"ran on generated stand-ins (checkpoints of random weights, generated pictures; job/standins.py), "
                   f"not on the articles' checkpoints and data. They show that the job runs, not what the articles "
                   f"found."), ""]
    miniature = on_the_miniature(records)
    if miniature:
        lines += [(f"**A miniature, its numbers its own**: {', '.join(miniature)} ran on a ViT trained here on "
                   f"generated pictures whose class is where a blob is (job/miniature.py), not on the articles' "
                   f"checkpoints and data: the articles' numbers do not apply, and the verdicts beside them say "
                   f"nothing. What carries over is the articles' conclusions, each judged on the miniature's own "
                   f"numbers below (\"on the miniature\"; over several seeds: the job/miniature.py folder's "
                   f"report.md, docs/miniature.md)."), ""]
    return lines


def main(argv=None):
    parser = script_parser(__doc__)
    parser.add_argument("folder", help="the folder the scripts wrote their --json files into")
    args = parser.parse_args(argv)
    print(f"wrote {build(args.folder)}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
