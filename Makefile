# The README's two commands. Each makes .venv when it is missing or older than requirements.lock: a fresh virtual
# environment, torch's CPU build where no NVIDIA GPU is (PyPI's default torch bundles 3 GB of CUDA libraries), then
# the lock. `make test PYTHON=python3.12 VENV=.venv-3.12` takes another Python; `make test-pythons` tests all three.
PYTHON ?= python3
VENV ?= .venv
TORCH := $(shell grep '^torch==' requirements.lock)
# torch's CPU build on Linux without nvidia-smi, its dependencies then from the lock; elsewhere PyPI's, with its own
TORCH_BUILD := $(shell [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 && echo --no-deps --index-url https://download.pytorch.org/whl/cpu)

.PHONY: quick test test-pythons
quick: $(VENV)/installed  ## the set-up, then both articles' quick checks as one job (results/report.md)
	$(VENV)/bin/python reproduce.py --quick

test: $(VENV)/installed  ## the set-up, then the tests, offline
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -n auto --dist loadgroup

$(VENV)/installed: requirements.lock
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q $(TORCH) $(TORCH_BUILD)
	$(VENV)/bin/python -m pip install -q -r requirements.lock
	$(VENV)/bin/python -m pip check
	touch $@

test-pythons:  ## the tests on each Python the README states (python3.11, python3.12, python3.13 on the PATH)
	for version in 3.11 3.12 3.13; do $(MAKE) test PYTHON=python$$version VENV=.venv-$$version || exit 1; done
