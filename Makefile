# One command to set up and regenerate the smoke outputs, one to set up and test. Everything runs offline.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
QUIET_PIP := 2>&1 | { grep -v '^WARNING: Location' || true; }
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROFILE ?= smoke

.PHONY: setup reproduce test test-fast sync export clean-nbs

$(BIN)/python:
	$(PY) -m venv $(VENV)

setup: $(BIN)/python  ## venv + torch (from the local wheel cache) + attnrepro (editable, with dev tools) + kernel
	$(BIN)/pip install -q --disable-pip-version-check torch==2.14.1 torchvision==0.29.1 $(QUIET_PIP)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[dev]" $(QUIET_PIP)
	$(BIN)/python -m ipykernel install --sys-prefix --name attnrepro --display-name "Python (attnrepro)" >/dev/null

reproduce: setup  ## regenerate every paper notebook at $(PROFILE) (default smoke: outputs/smoke/<paper>/)
	$(BIN)/attnrepro reproduce --profile $(PROFILE)

export:
	$(BIN)/nbdev_export

clean-nbs:
	$(BIN)/nbdev_clean

sync: export clean-nbs  ## fail if the notebooks and the library (or clean notebooks) differ from git
	@git diff --exit-code --stat -- attnrepro nbs || (echo "nbs/ and attnrepro/ out of sync: commit the export"; exit 1)
	@test -z "$$(git status --porcelain --untracked-files=all -- attnrepro | grep -v __pycache__)" || \
	  (echo "untracked files in attnrepro/ after export"; git status --porcelain -- attnrepro; exit 1)

test: setup  ## pytest: export sync, every notebook's own cells, library, runner, a smoke run of every paper notebook
	$(BIN)/pytest -q -ra tests

test-fast:  ## pytest only, without setup or the slow tests
	$(BIN)/pytest -q -m "not slow" tests
