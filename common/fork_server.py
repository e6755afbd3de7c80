"""Imported first by the loader's fork server (common/loader.py, worker_start), before numpy, and by nothing else:
its BLAS libraries then start no threads, so that the server is one thread when it forks a worker (a process of more
threads may fork a child that deadlocks, and Python 3.12 on warns that it may). The workers inherit it: each builds its
batches in one thread (docs/data.md#the-loader)."""
import os

for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[name] = "1"
