"""The scripts' flags in the job's commands, read as argparse reads them (a flag in full or abbreviated, its value
after it or joined by '='): --extra's, checked and its places resolved from where the job started (extra_flags); a
flag's value (flag_value); the job's outputs moved aside for --extra's check (outputs_moved)."""
import itertools
import os
import shlex
from pathlib import Path

from common.paths import CHECKOUT
from common.start_and_end import UserError
from job.scripts import SCRIPTS, script_file

SET_BY_THE_JOB = ("--json", "--plots", "--compare")  # and fine-tuning's FINETUNE_SET_BY_THE_JOB
FINETUNE_SET_BY_THE_JOB = ("--save-dir", "--resume")  # the backbone's --save-dir is the user's to give
OUTPUTS = ("--json", "--plots", "--save-dir")  # the flags of the places a script writes to


def names(token, *flags):
    """Whether a token is one of flags: in full or abbreviated (--pause for --pause-at), alone or with its value
    after '=' (an ambiguous one, --p, is refused by the script's check before the job)."""
    given = token.partition("=")[0]
    return len(given) > 2 and any(flag.startswith(given) for flag in flags)


def flag_of(before, token):
    """(flag, value, joined) of a token after `before`: a flag joined to its value by '=', or a value after its
    flag; any other token is a value of no flag."""
    flag, equals, value = token.partition("=")
    if equals and flag.startswith("--"):
        return flag, value, True
    return ("" if "=" in before else before), token, False


def flag_value(command, flag):
    """The value of flag's last use in command, or None."""
    found = None
    for before, token in itertools.pairwise(["", *command]):
        given, value, _ = flag_of(before, token)
        if names(given, flag):
            found = value
    return found


def extra_flags(texts):
    """{script: [flags]} from --extra SCRIPT=FLAGS; the script checks them itself (first_refusal in run_job). The
    value of a --model or --data-dir that names a place from where the job was started, and of the backbone's
    --save-dir, is that place's whole path, as OUT's and --models' are: the scripts run in the checkout."""
    extra = {script: [] for script in SCRIPTS}
    for text in texts or []:
        script, equals, flags = text.partition("=")
        if not equals or script not in SCRIPTS:
            raise UserError(f"--extra {text!r}: write SCRIPT=FLAGS with SCRIPT one of {', '.join(SCRIPTS)}, e.g. "
                            f"--extra 'finetune=--steps 30'")
        try:
            tokens = shlex.split(flags)
        except ValueError as error:
            raise UserError(f"--extra {text!r}: {error}") from error
        own = SET_BY_THE_JOB + (FINETUNE_SET_BY_THE_JOB if script == "finetune" else ())
        for token in tokens:
            if token.partition("=")[0] == "-h" or names(token, "--help"):
                raise UserError(f"--extra {text!r}: the job shows no script's help: python {script_file(script)} -h")
            if names(token, *own):
                raise UserError(f"--extra {text!r}: {token.partition('=')[0]} is set by reproduce.py itself")
        extra[script] += [user_place(before, token) for before, token in itertools.pairwise(["", *tokens])]
    return extra


def user_place(before, token):
    """token, or, where it is the value of --model or --data-dir that names a place from where the job was started
    (else from the checkout, where the scripts run), or of the backbone's --save-dir, with that place's whole path: the
    same command from any folder; a Hub id, or an empty value, as written."""
    flag, value, joined = flag_of(before, token)
    path = Path(value).expanduser()  # quoted in --extra, ~ reaches here as typed
    if names(flag, "--model", "--data-dir") and not path.exists() and (CHECKOUT / path).exists():
        path = CHECKOUT / path  # an input the scripts find in the checkout
    if value.strip() and (names(flag, "--save-dir") or names(flag, "--model", "--data-dir") and path.exists()):
        return f"{flag}={path.resolve()}" if joined else str(path.resolve())
    return token


def outputs_moved(command, out, scratch):
    """command, the places in OUT that it gives the outputs (OUTPUTS) moved under scratch; the pictures or a model
    kept in OUT stay where they are."""
    moved = []
    for before, token in itertools.pairwise(["", *command]):
        flag, value, _ = flag_of(before, token)
        if names(flag, *OUTPUTS) and value.startswith(f"{out}{os.sep}"):
            token = token[:len(token) - len(value)] + scratch + value[len(str(out)):]
        moved.append(token)
    return moved
