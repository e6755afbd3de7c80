"""reproduce.py's last lines: the table of each script's sections and verdicts, why a script did not finish, and what
to run next, so that the reason for the exit status is the last thing at the terminal, not scrolled away.

The reasons are the page's own words (job/page.py): what the job recorded in OUT/reproduce.json for a script that
wrote no JSON, and each section's "could not run" for one that did.
"""
import ast
import os
import shlex
import signal
from collections import Counter
from pathlib import Path

from compare.verdicts import NUMBER_VERDICTS, counts_text, judge
from job.page import on_standins, on_the_miniature
from job.scripts import script_file

ROOT = Path(__file__).resolve().parent.parent
STANDINS_COMMAND = "VIT_PART3_STANDINS_COMMAND"  # job/standins.py's command, which continues a job it started


def job_command(argv, dropped=("--force",)):
    """The command that continues this job, from the folder it was started in, less the flags `dropped`, as typed or
    abbreviated (--force has set the old results aside once: again, it would start the job over); job/standins.py's
    own when that started it (it builds what is missing, then runs this job)."""
    if os.environ.get(STANDINS_COMMAND):
        return os.environ[STANDINS_COMMAND]
    script = os.path.relpath(ROOT / "reproduce.py")
    kept = [token for token in argv if not (len(token) > 2 and any(flag.startswith(token) for flag in dropped))]
    return shlex.join(["python", str(ROOT / "reproduce.py") if script.startswith("..") else script, *kept])


def section_count(script):
    """How many sections the script has (its functions section_*, each main() calls), read from its source: the job
    imports no script (each runs in its own process)."""
    tree = ast.parse((ROOT / script_file(script)).read_text())
    return sum(isinstance(node, ast.FunctionDef) and node.name.startswith("section_") for node in tree.body)


def result_row(script, record):
    """{sections: (run, of all), counts: {verdict: n}, verdicts: the counts as text} of one script from its JSON
    (None: no JSON)."""
    total = section_count(script)
    rows = judge(script, record["numbers"], record.get("setup differences", {}))[0] if record else judge(script, {})[0]
    ran = total - len(record.get("could_not_run", [])) if record else 0
    return {"sections": (ran, total), "counts": Counter(row["verdict"] for row in rows), "verdicts": counts_text(rows)}


def paused(record):
    """What a paused fine-tuning run's "not run" rows mean (--quick pauses it after step 5)."""
    line = next((text for text in record.get("printed", []) if text.strip().startswith("paused after step")), None)
    return (f" ({line.strip().split(';')[0]}: its later rows are not run; the job's same command without --quick, "
            f"which pauses it (or the --pause-at of its --extra), runs the whole fine-tuning)") if line else ""


def why_not_run(script, record, not_run):
    """Why a script's numbers are "not run", in the page's words; "" when none is. not_run: the job's record's."""
    if record is None:
        return f"not run: {not_run.get(script) or 'no JSON'}"
    problems = [f"could not run section \"{problem['section']}\": {problem['why']}"
                for problem in record.get("could_not_run", [])]
    if problems or paused(record):
        return "; ".join(problems) or paused(record).strip().removeprefix("(").removesuffix(")")
    rows = judge(script, record["numbers"], record.get("setup differences", {}))[0]
    names = [row["name"] for row in rows if row["verdict"] == "not run"]
    return (f"every section ran but did not produce {len(names)} of the article's numbers: {', '.join(names[:3])}"
            + (", ..." if len(names) > 3 else "") + " (on the page)")


def no_json(status, log):
    """Why a script wrote no JSON, as the job's record and its footnote say: its exit status, or the signal that killed
    it (the same command runs it again, fine-tuning from its last save); log: where its lines are kept."""
    if status < 0 and -status in signal.valid_signals():
        killer = " (the system's out-of-memory killer sends SIGKILL)" if -status == signal.SIGKILL else ""
        return f"it was killed by {signal.Signals(-status).name}{killer} and wrote no JSON ({log})"
    return f"it ended with exit status {status} and wrote no JSON ({log})"


def notes(rows, records, not_run):
    """{script: footnote number} of each script whose "not run" cell is not 0, and the footnotes' lines."""
    marks, lines = {}, []
    for script, row in rows.items():
        why = why_not_run(script, records[script], not_run) if row["counts"]["not run"] else ""
        if why or row["sections"][0] < row["sections"][1]:
            marks[script] = len(marks) + 1
            lines.append(f"[{marks[script]}] {script_file(script)}: {why or 'not every section ran'}")
    return marks, lines


def final_table(rows, marks=None):
    """The job's table, a line a script: script | sections run of all | each verdict's count | time; a "not run"
    count whose script has a footnote carries its number."""
    marks = marks or {}
    header = ["script", "sections run", *NUMBER_VERDICTS, "time"]
    body = [[script_file(script), f"{row['sections'][0]} of {row['sections'][1]}",
             *(str(row["counts"][word]) + (f" [{marks[script]}]" if word == "not run" and script in marks else "")
               for word in NUMBER_VERDICTS), row["time"]] for script, row in rows.items()]
    widths = [max(len(line[k]) for line in [header, *body]) for k in range(len(header))]
    return [" | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in [header, *body]]


def standins_line(records):
    """Under the table of a job on job/standins.py's stand-ins, that its numbers mean nothing; on job/miniature.py's,
    that they are its own (as the page says first)."""
    if standins := on_standins(records):
        return [(f"the numbers of {', '.join(standins)} mean nothing: {'it' if len(standins) == 1 else 'they'} ran "
                 f"on generated stand-ins (checkpoints of random weights, generated pictures), which show that the job "
                 f"runs, not what the articles found")]
    if on_the_miniature(records):
        return [("these numbers are the miniature's own (a ViT trained here on generated pictures, job/miniature.py): "
                 "the articles' numbers do not apply; the conclusions above are what carries over")]
    return []


def conclusions_line(records):
    """The articles' conclusions over the five scripts, counted by verdict: what the page's first table holds."""
    rows = [row for script, record in records.items() for row in judge(
        script, record["numbers"] if record else {}, record.get("setup differences", {}) if record else {})[1]]
    return [f"the articles' conclusions: {counts_text(rows)}; each on the page, first"] if rows else []


def exit_status(rows, strict):
    """0 when every script ran every section; 1 when one did not, and with --strict when a number differs."""
    incomplete = any(row["sections"][0] < row["sections"][1] for row in rows.values())
    return int(incomplete or (strict and any(row["counts"]["differs"] for row in rows.values())))


def next_line(rows, status, argv, offline, lacking=()):
    """The one line after the reasons: the command to run next, and what it does. lacking: the scripts that could not
    start for want of a piece (a download, a local copy); another reason asks for what its line says (a flag)."""
    command = job_command(argv)
    if not status:
        return ""
    if not any(row["sections"][0] < row["sections"][1] for row in rows.values()):  # --strict and a number differs
        return (f"status 1: --strict and a number differs from the article's (the page's differs rows); without "
                f"--strict the same job ends 0: {job_command(argv, ('--force', '--strict'))}")
    miniature = (f"offline meanwhile: {shlex.join(['python', os.path.relpath(ROOT / 'job' / 'miniature.py'), 'DIR'])} "
                 f"judges the articles' conclusions on a ViT trained here on generated pictures, in minutes "
                 f"(docs/miniature.md)\n" if offline else "")
    unfinished = {script for script, row in rows.items() if row["sections"][0] < row["sections"][1]}
    if not unfinished <= set(lacking):  # a failure the same command would repeat
        return (f"{miniature}next: do what each line above says (a flag it names goes in --extra 'SCRIPT=FLAGS'); then "
                f"this command, with it, runs what did not finish and skips what did: {command}")
    where = ("with HF_HUB_OFFLINE unset and the Hub reachable, or with the local copies named above"
             if offline else "once what is named above is here")
    return f"{miniature}next: {where}, the same command runs what did not finish and skips what did: {command}"
