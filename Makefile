# One command to set up and regenerate the smoke outputs, one to set up and test, one to open JupyterLab.
# Everything runs offline.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
QUIET_PIP := 2>&1 | { grep -v '^WARNING: Location' || true; }
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROFILE ?= smoke
LAB_ARGS ?=
# the browser test drives Debian's chromium: Playwright never downloads a browser of its own
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
ALLOW_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: setup reproduce test test-fast sync export clean-nbs lab site browser

$(BIN)/python:
	$(PY) -m venv $(VENV)

setup: $(BIN)/python  ## venv + torch (from the local wheel cache) + attnrepro (editable, with dev tools) + kernel
	$(BIN)/pip install -q --disable-pip-version-check torch==2.14.1 torchvision==0.29.1 $(QUIET_PIP)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[dev]" $(QUIET_PIP)
	$(BIN)/python -m ipykernel install --sys-prefix --name attnrepro --display-name "Python (attnrepro)" >/dev/null

lab: setup  ## JupyterLab at the project root; every notebook opens with the project's kernel (attnrepro)
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --MappingKernelManager.default_kernel_name=attnrepro $(ALLOW_ROOT) $(LAB_ARGS)

site: setup  ## static HTML of the committed results (outputs/site/index.html: claims dashboard, every executed notebook)
	$(BIN)/attnrepro site

browser:  ## Debian's chromium for the browser test: installed with apt-get when missing (as root), else says how
	@command -v chromium >/dev/null && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "chromium not found: the browser test needs it (Debian/Ubuntu: sudo apt-get install -y chromium)"; exit 0; fi; \
	echo "installing chromium (apt-get)"; export DEBIAN_FRONTEND=noninteractive; \
	apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }; \
	chromium --version 2>/dev/null

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

test: setup browser  ## pytest: export sync, every notebook's own cells, library, runner, a smoke run of every paper notebook, the browser test
	$(BIN)/pytest -q -ra --durations=15 tests

test-fast:  ## pytest only, without setup or the slow tests
	$(BIN)/pytest -q -m "not slow" tests
