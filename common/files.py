"""The one way the scripts write a file: whole or not at all, and a failure said in one line.

write_atomic(path, write) calls write(f) on a file with a unique temporary name in path's folder,
flushes and fsyncs it, renames it over path and fsyncs the folder, so that a crash, a full disk or a
second run writing the same path at the same moment never leaves a half file under path and never
costs the good file already there. On any failure the temporary file is removed and a UserError
names the path and the reason ("No space left on device"). The file gets the mode the umask gives any
new file (0644 under umask 022), not mkstemp's 0600: results are for others to read too.
"""
import contextlib
import os
import secrets
from pathlib import Path

from common.errors import UserError

TEMP_PREFIX = ".tmp-"  # every temporary file the writer makes starts so: tests look for leftovers by it


def reason(error):
    """The operating system's words for an error ('No space left on device'), found through wrapped errors.

    torch.save raises RuntimeError ("unexpected pos ...") around the OSError that its writer got; the
    chain of causes still holds that OSError.
    """
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and (seen.strerror or seen.errno):
            return seen.strerror or os.strerror(seen.errno)
        seen = seen.__cause__ or seen.__context__
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:160]


def fsync_folder(folder):
    """Make the rename itself durable; a folder that cannot be opened (Windows) is left to the system."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def create_temporary(target):
    """(descriptor, path) of a new file beside target, made by this call alone (O_EXCL), mode 0666 less the umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        path = target.parent / f"{TEMP_PREFIX}{target.name}-{secrets.token_hex(4)}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue


def write_atomic(path, write, text=False, what="file"):
    """write(f) into a fresh temporary file beside path, then rename it over path; returns Path(path).

    text=True opens the file in text mode (UTF-8). what names the file in the error ("checkpoint").
    Any failure, Ctrl-C included, removes the temporary file; an OSError or a library's wrapped one
    ends in a UserError that names the path and the reason.
    """
    target = Path(path)
    temporary = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = create_temporary(target)
        with os.fdopen(handle, "w" if text else "wb", **({"encoding": "utf-8"} if text else {})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
        temporary = None
        fsync_folder(target.parent)
    except (OSError, RuntimeError, ValueError) as error:
        raise UserError(f"cannot write the {what} {target}: {reason(error)}") from error
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    return target


def write_text(path, content, what="file"):
    return write_atomic(path, lambda f: f.write(content), text=True, what=what)
