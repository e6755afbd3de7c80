"""The job's own environment: its process keeps to one thread, the scripts it starts get the user's. It loads only
os, which the interpreter has loaded already: reproduce.py calls one_thread() before numpy loads."""
import os

# for the job's own process alone (reproduce.py): numpy's OpenBLAS then starts no thread pool, and the job forks its
# scripts from a process of one thread; the scripts get the environment the user gave (scripts_environment)
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1"}
SET_FOR_THE_JOB = "VIT_PART3_SET_FOR_THE_JOB"  # the names one_thread() set, which the scripts do not inherit
# folders the job and its scripts both read, whose relative value each would read from its own working folder (the
# scripts run in the checkout): the scripts get them made absolute from the job's
FOLDERS = ("VIT_PART3_DATA", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "HF_XET_CACHE",
           "HF_TOKEN_PATH", "XDG_CACHE_HOME")


def one_thread():
    """Before numpy loads in the job: ONE_THREAD's settings the user has not made, set for this process alone (a
    second call keeps the first's record of them)."""
    set_here = [name for name in ONE_THREAD if name not in os.environ]
    set_before = os.environ.get(SET_FOR_THE_JOB, "").split()
    os.environ.update({name: ONE_THREAD[name] for name in set_here},
                      **{SET_FOR_THE_JOB: " ".join(set_before + set_here)})


def scripts_environment():
    """The environment as the user gave it, for the processes the job starts: without what one_thread() set, FOLDERS
    absolute (~ expanded), as the job reads them."""
    set_here = os.environ.get(SET_FOR_THE_JOB, "").split()
    given = {name: value for name, value in os.environ.items() if name not in (*set_here, SET_FOR_THE_JOB)}
    return given | {name: os.path.abspath(os.path.expanduser(given[name])) for name in FOLDERS if given.get(name)}
