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

test: $(VENV)/installed  ## the set-up, ruff (lines of at most 120 characters), then the tests, offline
	$(VENV)/bin/ruff check .
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -n auto --dist loadgroup

$(VENV)/installed: requirements.lock
	@$(PYTHON) -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' || { echo "make: $(PYTHON) is \
	not Python 3.11 to 3.13, the tested ones: name one, e.g. make $(MAKECMDGOALS) PYTHON=python3.12" >&2; exit 1; }
	@if [ -e $(VENV) ] && [ ! -e $(VENV)/made-by-make ]; then echo "make: $(VENV) was not made by make, which leaves it alone: \
	move it away, or name another folder: make $(MAKECMDGOALS) VENV=.venv-make" >&2; exit 1; fi
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV) && touch $(VENV)/made-by-make
	$(VENV)/bin/python -m pip install -q $(TORCH) $(TORCH_BUILD)
	$(VENV)/bin/python -m pip install -q -r requirements.lock
	$(VENV)/bin/python -m pip check
	touch $@

test-pythons:  ## the tests on each Python the README states (python3.11, python3.12, python3.13 on the PATH)
	for version in 3.11 3.12 3.13; do $(MAKE) test PYTHON=python$$version VENV=.venv-$$version || exit 1; done
