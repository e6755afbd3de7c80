"""Both articles reproduced in one command: the five scripts one after another, then the page.

    python reproduce.py --quick               # the README's quick checks
    python reproduce.py                       # the articles' full setup into results/ (hours on a CPU)
    python reproduce.py OUT --models M --imagenette I --beans B    # offline, from local copies
    python reproduce.py --device cuda --precision bf16             # every script on the GPU, in bfloat16
    python job/standins.py DIR             # the whole job offline on generated stand-ins (numbers mean nothing)

Each script runs in a process of its own with `--json OUT/<script>.json --plots OUT/figures --compare`,
its lines passed through and kept in OUT/logs/<script>.log; then OUT/report.md and one table of each
script's sections run and verdict counts. Before any work: the downloads with their sizes, the room for
them and for every file the job writes, and (offline) what each script that cannot run lacks.

Resumable: a script whose JSON in OUT is complete and made by the same command and code (the script,
common/, compare/ and figures/, its reference numbers, the library versions; OUT/reproduce.json) from the
same files (its pictures and checkpoint, by size, times and inode) is skipped, --force runs it again; fine-tuning
continues from its checkpoint in OUT/finetune-run/ made so, --pause-at aside.
Ctrl-C or SIGTERM reach the running script, which stops as it would alone; the job then says what it
kept and that the same command continues it. A script ends with its job however the job ends, and one
job at a time writes to an OUT (job/child_process.py).

Exit status: 0 when every script ran every section; 1 when one could not (--strict: also when a
number differs from the article's); 2 for a bad flag or path (one line, before any work); 130 and
143 after Ctrl-C and SIGTERM.
"""
from common.start_and_end import Terminated, UserError, before_torch_loads, guarded, say
from job.environment import one_thread

if __name__ == "__main__":  # before the libraries load: a Ctrl-C then is one line, as a later one
    before_torch_loads()
    one_thread()  # before numpy loads: the job forks its scripts from a process of one thread

import itertools
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from huggingface_hub import is_offline_mode

from common.files import CHECKPOINT, CHECKPOINT_FORMAT, SAVED_AVERAGE, SAVED_LAST, read_checkpoint, reason
from common.run import (
    DEVICE_CHOICES,
    PRECISIONS,
    check_output,
    nonempty_path,
    pick_device,
    script_parser,
    set_precision,
)
from job import downloads, ending
from job.child_process import StopRequests, first_refusal, only_job_on, run_logged
from job.commands import extra_flags, flag_value, outputs_moved
from job.page import JOB_RECORD, build
from job.resuming import (
    CHECKPOINT_ENTRY,
    checkpoint_key,
    code_digest,
    command_key,
    file_digest,
    inputs_stamp,
    is_complete,
    pause_step,
    read_manifest,
    readable_record,
    why_again,
    write_manifest,
)
from job.scripts import PAGE_WRITES_MB, SCRIPTS, script_file
from job.time_estimate import MINUTE, clock, duration, estimate_seconds, how_estimated, measure_speed

if __name__ == "__main__" and hasattr(signal, "SIGPIPE"):  # a reader gone (| head): the job ends quietly, as cat does,
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # its script, sent SIGTERM, saves (the scripts keep Python's rule)

ROOT = Path(__file__).resolve().parent
FINETUNE_RUN = "finetune-run"  # fine-tuning's --save-dir in OUT
KEPT_ASIDE = {SAVED_AVERAGE: "model.previous", SAVED_LAST: "model-last.previous",  # fine-tuning's files of another
              CHECKPOINT: "checkpoint.previous.pt"}  # command or code, kept there as it starts afresh (the checkpoint
                                                    # last: a failed move leaves the reason to start afresh as it was),
                                                    # or beside those kept before: unused()

# The README's machines, each script's times on them (job/scripts.py) and their matrix-multiply speeds; the quick
# times are one whole job's (benchmarks/quick_job.py), "job" its wall time, the scripts' processes and its own.
REFERENCE = {
    "quick": {"machine": "the Quick check table's 2-core CPU", "gflops": 80, "job": 14.1 * MINUTE,
              "seconds": {script: row["seconds"]["quick"] for script, row in SCRIPTS.items()}},
    "full": {"machine": "the 2-core Xeon of \"How long will it take\"", "gflops": 300,
             "seconds": {script: row["seconds"]["full"] for script, row in SCRIPTS.items()}}}


# ---------------------------------------------------------------- the flags

def parse_flags(argv):
    parser = script_parser(__doc__)
    parser.add_argument("out", nargs="?", default=str(ROOT / "results"), metavar="OUT", type=nonempty_path,
                        help="the folder for the JSON files, figures, logs, fine-tuning's checkpoint and report.md "
                             "(default: %(default)s, results/ in the checkout wherever the job is started)")
    parser.add_argument("--quick", action="store_true",
                        help="the README's quick checks (its Quick check table's flags), not the articles' full setup")
    parser.add_argument("--device", choices=DEVICE_CHOICES,
                        help="passed to every script that has it (default: each script's own, auto)")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="passed to every script that has it (default: fp32, the articles')")
    parser.add_argument("--models", metavar="DIR", type=nonempty_path,
                        help=f"local copies of the checkpoints laid out by Hub id: DIR/"
                        f"{downloads.VIT}/, DIR/{downloads.IN21K}/; a script gets --model DIR/<its id> where it exists")
    parser.add_argument("--imagenette", metavar="DIR", type=nonempty_path,
                        help="a local copy of imagenette2-160 (the Part 3 scripts' --data-dir)")
    parser.add_argument("--beans", metavar="DIR", type=nonempty_path,
                        help=f"a local copy of {downloads.BEANS}'s files (vit_backbone.py's --data-dir)")
    parser.add_argument("--force", action="store_true", help="run every script again, fine-tuning from step 0")
    parser.add_argument("--strict", action="store_true", help="exit status 1 also when a number differs from the "
                                                              "article's (for CI)")
    parser.add_argument("--extra", action="append", metavar="SCRIPT=FLAGS",
                        help="more flags for one script, repeatable, e.g. --extra 'finetune=--steps 30'; they are "
                             "part of its command, so a change runs it again")
    args = parser.parse_args(argv)
    args.extra = extra_flags(args.extra)
    downloads.check_copies(args)
    return args


# ---------------------------------------------------------------- each script's command and code

def script_command(script, args, out, resume=False):
    """The script's command line: quick flags, local copies, device, precision, checkpoint, extras, outputs.
    Setup is arithmetic: it takes no model, data, device, precision or figures."""
    command = [sys.executable, script_file(script)] + (SCRIPTS[script]["quick"] if args.quick else [])
    needs = SCRIPTS[script]["needs"]
    if needs and args.models and (Path(args.models) / needs[0]).is_dir():
        command += ["--model", str(Path(args.models).resolve() / needs[0])]
    data = args.beans if script == "backbone" else args.imagenette
    for flag, value in (("--data-dir", data and str(Path(data).resolve())), ("--device", args.device),
                        ("--precision", args.precision)):
        if value and script != "setup":
            command += [flag, value]
    if script == "finetune":
        command += ["--save-dir", str(out / FINETUNE_RUN)] + (["--resume"] if resume else [])
    command += args.extra[script] + ["--json", str(out / f"{script}.json")]
    return command + (["--plots", str(out / "figures")] if script != "setup" else []) + ["--compare"]


def script_keys(args, out):
    """What a script's JSON in OUT must have been made by to count as done: its command, its code and the stamp of
    the files it reads (inputs_stamp; stored as taken after its run, its own downloads included)."""
    commands = {script: script_command(script, args, out) for script in SCRIPTS}
    return {script: {"command": command_key(command, out), "code": code_digest(script),
                     "inputs": inputs_stamp(script, command)} for script, command in commands.items()}


# ---------------------------------------------------------------- what the job needs

def given_pieces(script, command):
    """The pieces of a script that its command names a local copy of (--extra's --model, --data-dir): here for it."""
    needs = SCRIPTS[script]["needs"]  # its checkpoint, then its data
    return {piece for piece, flag in zip(needs, ("--model", "--data-dir"), strict=False)
            if (value := flag_value(command, flag)) and (ROOT / os.path.expanduser(value)).exists()}


def plan_pieces(to_run, here, can_download, given=None):
    """(fetch: [piece], cannot: {script: [missing piece]}): a script lacking a piece that cannot be downloaded
    cannot run, one its command names a copy of (given: {script: pieces}) aside; an optional piece (setup's
    ResNet-50) is downloaded when it can be, or done without."""
    fetch, cannot = [], {}
    for script in to_run:
        missing = [piece for piece in SCRIPTS[script]["needs"] if not here[piece] and piece not in
                   (given or {}).get(script, ())]
        lacking = [piece for piece in missing if not can_download[piece]]
        if lacking:
            cannot[script] = lacking
            continue
        optional = [piece for piece in SCRIPTS[script]["optional"] if not here[piece] and can_download[piece]]
        fetch += [piece for piece in missing + optional if piece not in fetch]
    return fetch, cannot


def room_needed(fetch, out, runs, args, resumes):
    """{folder: MB} the job will write: downloads into the caches and data/; into OUT, each script's JSON, figures
    and log, the page, fine-tuning's checkpoint (the weights, their average and the momentum, written whole beside
    the old one) and its two saved models (the average and the last weights, each written whole).
    resumes: whether fine-tuning continues from OUT's checkpoint, overwriting it; if not, a checkpoint there is kept
    aside (prepare()), its room still taken."""
    need = downloads.room(fetch)
    if runs:
        need[out] = sum(SCRIPTS[script]["writes MB"] for script in runs) + PAGE_WRITES_MB
    if "finetune" in runs:
        checkpoint = out / FINETUNE_RUN / CHECKPOINT
        freed = checkpoint.stat().st_size / 1e6 if resumes and checkpoint.is_file() else 0
        weights = downloads.weights_mb(downloads.IN21K, args.models)
        need[out] += max(0.0, 2 * 3 * weights - freed) + 2 * weights  # the checkpoint, then model/, model-last/
    return need


# ---------------------------------------------------------------- the results

def page_is_stale(page, out):
    """No page, a JSON newer than it (a job whose page could not be written, or that a signal stopped after it), or
    a JSON whose run it does not name (an older page put back, an emptied one)."""
    if not page.is_file():
        return True
    made, text = page.stat().st_mtime_ns, page.read_text(errors="replace")
    paths = [path for path in (out / f"{script}.json" for script in SCRIPTS) if path.is_file()]
    runs = [record.get("environment", {}).get("started", "?") for record in map(readable_record, paths) if record]
    return any(path.stat().st_mtime_ns > made for path in paths) or any(f"started {run}," not in text for run in runs)


# ---------------------------------------------------------------- the job

def plan(args, out, manifest):
    """(keys, done, cannot, runnable, lines): what is complete, what lacks a piece (and why), what runs, and the lines
    that say so; UserError when a disk has too little room."""
    keys = script_keys(args, out)
    done = [script for script in SCRIPTS if not args.force and is_complete(out, script, keys[script], manifest)]
    to_run = [script for script in SCRIPTS if script not in done]
    pieces = {piece for script in to_run for piece in SCRIPTS[script]["needs"] + SCRIPTS[script]["optional"]}
    here = {piece: piece in pieces and downloads.piece_is_here(piece, args) for piece in downloads.PIECES}
    answers = downloads.answering({piece for piece in pieces if not here[piece]})
    given = {script: given_pieces(script, script_command(script, args, out)) for script in to_run}
    fetch, lacking = plan_pieces(to_run, here, {piece: answers.get(piece, False) for piece in downloads.PIECES}, given)
    runnable = [script for script in to_run if script not in lacking]
    cannot = {script: downloads.lacks_text(missing, is_offline_mode()) for script, missing in lacking.items()}
    resumes = "finetune" in runnable and not why_afresh(args, out, keys["finetune"], manifest)  # reads the checkpoint
    what = "the quick checks" if args.quick else "the full setup"
    lines = [f"reproduce.py: {what} of the five scripts into {out}: {len(done)} done already, {len(runnable)} to run"]
    lines += [downloads.fetch_line(fetch)] if fetch or (runnable and not lacking) else []
    lines += [mirrors] if fetch and (mirrors := downloads.mirror_line(fetch)) else []
    lines += [f"cannot run {script_file(script)}: {why}" for script, why in cannot.items()]
    lines.append(downloads.disk_line(room_needed(fetch, out, runnable, args, resumes)))
    return keys, done, cannot, runnable, lines


def prepare(script, args, out, keys, manifest):
    """The script's command. Fine-tuning: --resume from OUT/finetune-run when its checkpoint is whole and was made by
    the same command and code, else a fresh start, the old checkpoint kept as checkpoint.previous.pt and the old
    saved models as model.previous/ and model-last.previous/ (no earlier run's model stays beside this run's
    checkpoint). A stale JSON is moved to OUT/logs/, and why it is said (why_again)."""
    resume = False
    if script == "finetune":
        why = why_afresh(args, out, keys[script], manifest)
        resume = not why
        if why and (kept := keep_aside(out / FINETUNE_RUN)):  # hours of training may be in them: kept, not deleted
            ones = "one is" if len(kept) == 1 else "ones are"
            say(f"{script_file(script)} starts afresh: {why}; the old {ones} kept as {', '.join(map(str, kept))}")
        earlier = manifest.get(CHECKPOINT_ENTRY, {}).get("seconds", 0) if resume else 0  # its runs' wall time
        manifest[CHECKPOINT_ENTRY] = {**checkpoint_maker(args, out, keys[script]), "seconds": earlier}
    made, earlier = manifest.get(script), out / f"{script}.json"
    why = why_again(made, keys[script], earlier) if made and earlier.is_file() else ""
    if (kept := move_stale(out, script, manifest)) and why:
        say(f"{script_file(script)} runs again: {why}; that JSON is kept as {kept}")
    return script_command(script, args, out, resume)


def checkpoint_maker(args, out, key):
    command = script_command("finetune", args, out)
    return {"command": checkpoint_key(command, out), "code": key["code"], "inputs": key["inputs"]}


def why_afresh(args, out, key, manifest):
    """Why fine-tuning cannot continue from OUT's checkpoint, "" when it can: it is there, was made by the same
    command and code, its pictures and model files are as they were after the run that made it (inputs_stamp: by
    size, times and inode; the script checks the pictures by their bytes), it reads back whole, as the script's
    --resume will read it, and it is not past the command's --pause-at (--resume refuses each of these on every
    call)."""
    checkpoint = out / FINETUNE_RUN / CHECKPOINT
    if not checkpoint.is_file():
        return "there is no checkpoint"
    made, now = manifest.get(CHECKPOINT_ENTRY, {}), checkpoint_maker(args, out, key)
    if args.force or any(made.get(field) != now[field] for field in ("command", "code")) or "inputs" not in made:
        return "its checkpoint was made by another command or code (or --force)"
    if made["inputs"] != now["inputs"]:  # --resume would refuse it on every run of this command
        return "a picture under its --data-dir or a file of its --model changed since its checkpoint was made"
    try:
        step = read_checkpoint(checkpoint, CHECKPOINT_FORMAT, script_file("finetune"))["step"]
    except UserError:  # --resume would refuse it on every run of this command
        return "its checkpoint is damaged (truncated, unreadable, or changed since it was written)"
    pause = pause_step(script_command("finetune", args, out))
    return f"its checkpoint is at step {step}, past --pause-at {pause}" if pause and pause < step else ""


def keep_aside(run):
    """Fine-tuning's files in its folder run moved to their KEPT_ASIDE names, each with the number that is free for
    all of them (unused()): a checkpoint and the models of its run keep one number. The new names."""
    names = dict(zip(KEPT_ASIDE, unused(*(run / name for name in KEPT_ASIDE.values())), strict=True))
    found = [name for name in KEPT_ASIDE if (run / name).exists()]
    for name in found:
        move(run / name, names[name])
    return [names[name] for name in found]


def unused(*kept):
    """kept (names with .previous), or where one of them is taken already, the first of their .previous-2, -3, ...
    that is free for all: a file set aside (hours of training, an earlier setup's JSON) is never replaced."""
    assert all(".previous" in path.name for path in kept), kept  # else no number would make them free
    for number in itertools.count(1):
        suffix = ".previous" if number == 1 else f".previous-{number}"
        named = [path.with_name(path.name.replace(".previous", suffix, 1)) for path in kept]
        if not any(os.path.lexists(path) for path in named):
            return named


def move(source, target):
    """os.replace, its failure (a read-only disk) one line naming both."""
    try:
        os.replace(source, target)
    except OSError as error:
        raise UserError(f"cannot move {source} to {target} ({reason(error)}): make OUT writable") from error


def move_stale(out, script, manifest):
    """OUT keeps only the JSON of this job's commands, so the page never mixes two setups; the old one is kept aside,
    and the figures drawn from it in OUT/figures are removed (a run draws its own, and the page draws them again from
    its JSON): a reused OUT/figures holds no figure of an earlier run. The page, which reports that JSON, goes beside it
    until the job writes its own (a job stopped now would leave it showing what was set aside). Where the JSON went."""
    stale, page, kept = out / f"{script}.json", out / "report.md", None
    if stale.is_file():
        move(stale, kept := unused(out / "logs" / f"{script}.previous.json")[0])
        if page.is_file():
            move(page, unused(out / "logs" / "report.previous.md")[0])
    for name in SCRIPTS[script]["figures"]:
        try:
            (out / "figures" / name).unlink(missing_ok=True)
        except OSError as error:
            raise UserError(f"cannot remove {out / 'figures' / name} ({reason(error)}): make OUT writable") from error
    manifest.pop(script, None)
    write_manifest(out, manifest)
    return kept


def kept_text(out, script, record, started):
    """What a script stopped by a signal kept: its JSON, the checkpoint fine-tuning saved in this run, or nothing."""
    kept = [out / f"{script}.json"] if record is not None else []
    checkpoint = out / FINETUNE_RUN / CHECKPOINT
    if script == "finetune" and checkpoint.is_file() and checkpoint.stat().st_mtime >= started:
        kept.append(checkpoint)
    return f"which saved {' and '.join(map(str, kept))}" if kept else "which saved nothing"


def stopped_line(signum, argv, during=""):
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    return f"stopped by {name}{during}; the same command continues the job: {ending.job_command(argv)}"


def start_estimate(args, runnable, estimable, reference):
    """This machine's speed, measured only when an estimate can be made and a script with a model is in it (setup's
    time is its start-up), and the job's time, or why there is none."""
    if estimable != runnable:
        say("time: not estimated, --extra changes the work of "
            + ", ".join(script_file(script) for script in runnable if script not in estimable))
    gflops = measure_speed(args.device_chosen) if set(estimable) - {"setup"} else None
    if runnable and estimable == runnable:
        say(f"time: about {duration(estimate_seconds(runnable, reference, gflops, {}))} for {len(runnable)} "
            f"script(s), {how_estimated(reference, gflops, args.device_chosen)}")
    return gflops


def check_extra(args, out):
    """Each script given --extra checks its whole command, runnable or not, before OUT, its logs or its lock exist: a
    typo costs seconds, not a job, and leaves nothing. Its outputs go to a scratch folder; a done script is not
    asked."""
    if not any(args.extra.values()):
        return
    manifest = read_manifest(out, args.force) if out.is_dir() else {}
    keys = script_keys(args, out)
    asked = [s for s in SCRIPTS if args.extra[s] and (args.force or not is_complete(out, s, keys[s], manifest))]
    with tempfile.TemporaryDirectory() as scratch:
        refused = first_refusal({s: outputs_moved(script_command(s, args, out), out, scratch) for s in asked}, ROOT)
    if refused:
        raise UserError(f"--extra for {script_file(refused[0])}: {refused[1].replace(scratch, str(out))}")


def run_job(args, argv, out, lock):
    """Plan, check, run what is not done in order, then the table and the page; the exit status."""
    manifest = read_manifest(out, args.force)
    keys, done, cannot, runnable, lines = plan(args, out, manifest)  # a disk with too little room: nothing made yet
    check_output(out / "logs", "OUT", folder=True)  # after the lock and the record: a refusal leaves OUT as it was
    if (out / "figures").is_dir() and set(SCRIPTS) - set(done):  # its scripts' old figures are removed as they run
        check_output(out / "figures", "OUT", folder=True)
    for line in lines:
        say(line)
    manifest.update({"command": ending.job_command(argv),  # as the terminal's: runnable from where the job started
                     "not run": {**dict.fromkeys(runnable, "the job ended before it ran"), **cannot}})
    if args.force:  # every result set aside now: the command that continues a stopped job, without it, runs the rest
        for script in SCRIPTS:
            move_stale(out, script, manifest)
        manifest.pop(CHECKPOINT_ENTRY, None)  # its checkpoint is continued by no later job
        write_manifest(out, manifest)
    reference = REFERENCE["quick" if args.quick else "full"]
    estimable = [script for script in runnable if not args.extra[script]]  # --extra changes what a script does
    gflops = start_estimate(args, runnable, estimable, reference)
    times, finished = {script: "-" for script in SCRIPTS}, {}
    with StopRequests() as stop:
        for index, script in enumerate(SCRIPTS, 1):
            name = script_file(script)
            if stop.asked:  # it came between two scripts
                break
            if script in done:
                times[script] = f"skipped ({clock(manifest[script].get('seconds', 0))} before)"
                say(f"[{index}/5] {name}: skipped, its JSON in OUT is complete and was made by the same command and "
                    f"code from the same files (--force runs it again)")
                continue
            if script in cannot:  # said in the plan; a JSON of its own made otherwise is set aside, and said to be
                if kept := move_stale(out, script, manifest):
                    say(f"{name} cannot run: its earlier JSON is kept as {kept}")
                continue
            command = prepare(script, args, out, keys, manifest)
            if stop.asked:  # it came while the command was prepared: no script is started
                break
            left = [s for s in runnable if s not in finished]
            estimate = (f" about {duration(estimate_seconds(left, reference, gflops, finished))} left in the job "
                        f"(estimate)" if set(left) <= set(estimable) else "")
            say(f"\n[{index}/5] {name} ...{estimate}")
            started = time.time()
            status, seconds, logged = run_logged(command, ROOT, out / "logs" / f"{script}.log", stop, lock, say)
            stamp = inputs_stamp(script, command)  # what it read, its own downloads too: what the next job compares
            earlier = manifest[CHECKPOINT_ENTRY]["seconds"] if script == "finetune" else 0  # its checkpoint's runs'
            seconds += earlier
            if script == "finetune":
                manifest[CHECKPOINT_ENTRY].update(seconds=seconds, inputs=stamp)
            log = f"logs/{script}.log" if logged else "its log could not be written"
            seconds = round(seconds, 1)  # one clock: the terminal, reproduce.json and the page show these seconds
            record = readable_record(out / f"{script}.json")
            if record is not None:  # written by this run: move_stale took any older one away
                manifest[script] = {"key": {**keys[script], "inputs": stamp},
                                    "json": file_digest(out / f"{script}.json"), "seconds": seconds}
                del manifest["not run"][script]
            else:
                manifest["not run"][script] = ending.no_json(status, log)
            write_manifest(out, manifest)
            if stop.asked:
                say(stopped_line(stop.asked[0], argv, f" during {name}, {kept_text(out, script, record, started)}"))
                return 128 + stop.asked[0]
            finished[script], times[script] = seconds, clock(seconds)
            row = ending.result_row(script, record)
            clocked = "its processes' wall time, resumed after a stop" if earlier else "its process's wall time"
            print(f"{name}: {clock(seconds)} ({clocked}), " + (
                  f"{row['sections'][0]} of {row['sections'][1]} sections; "
                  f"{row['verdicts']}{ending.paused(record)}" if record else
                  f"{manifest['not run'][script]}: see the lines above"), flush=True)
    if stop.asked:
        say(stopped_line(stop.asked[0], argv))
        return 128 + stop.asked[0]
    return finish(args, argv, out, (cannot, finished, times), manifest["not run"])


def finish(args, argv, out, ran, not_run):
    """The table, then the page (built again when anything ran or is newer than it), then why a script did not
    finish and the command to run next, last, where the exit status is read; the exit status."""
    (cannot, finished, times), records = ran, {script: readable_record(out / f"{script}.json") for script in SCRIPTS}
    rows = {script: {**ending.result_row(script, records[script]), "time": times[script]} for script in SCRIPTS}
    marks, footnotes = ending.notes(rows, records, not_run)
    lines = ending.final_table(rows, marks) + ending.conclusions_line(records) + ending.standins_line(records)
    print("\n" + "\n".join(lines), flush=True)  # before the page: it may fail
    page, problem = out / "report.md", None
    if finished or cannot or page_is_stale(page, out):
        try:
            build(out, say=say)
        except UserError as error:  # a full or read-only OUT: the table above holds the counts
            problem = error
    status = ending.exit_status(rows, args.strict)
    next_line = ending.next_line(rows, status, argv, is_offline_mode() and bool(cannot), cannot)
    if problem:  # the same command also builds the page again, once the scripts' next line is done
        status, next_line = 1, next_line or f"next: once {out} can be written, python -m job.page {out} writes the page"
    print("\n".join([f"page: {page}" if problem is None else f"page: not written: {problem}", *footnotes,
                     next_line]).rstrip(), flush=True)
    return status


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_flags(argv)
    args.device_chosen = pick_device(args.device or "auto")  # a missing GPU is refused before the plan
    set_precision(args.device_chosen, args.precision or "fp32")  # and tf32 off an NVIDIA GPU
    out = Path(args.out).resolve()
    check_extra(args, out)
    check_output(args.out, "OUT", folder=True)
    lock = None
    try:
        lock = only_job_on(out, say)  # held while the job runs, and by each script it starts
        in_the_way = [out / name for name in ("logs", FINETUNE_RUN, "figures") if (out / name).is_file()]
        in_the_way += [path for path in (out / FINETUNE_RUN / CHECKPOINT, out / JOB_RECORD, out / "report.md",
                                         *(out / f"{script}.json" for script in SCRIPTS))
                       if path.exists() and not path.is_file()]  # a folder, or a pipe, whose reading waits for ever
        if in_the_way:  # found now, not when the script that writes there starts, hours into the job
            raise UserError(f"{in_the_way[0]} stands where the job writes its own: move it away, or give this job "
                            f"another OUT")
        return run_job(args, argv, out, lock)
    except KeyboardInterrupt as stop:  # a signal outside a script's run: while the job plans, checks, builds the page
        signum = signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT
        say(stopped_line(signum, argv))
        return 128 + signum
    finally:
        if lock:
            lock.close()  # its file removed, unless a script of the job still runs (job/child_process.py)


if __name__ == "__main__":
    sys.exit(guarded(main))
