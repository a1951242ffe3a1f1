# Two commands for a new user:  `make demo` (set up + run the main job on the demo data)
# and `make test` (set up + run the tests). Both create .venv/ with python3 -m venv + pip.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TMPENV := $(CURDIR)/.venv/tmp

# Offline, no telemetry, caches in a throwaway folder (nothing is downloaded at run time).
export HF_HUB_OFFLINE=1
export YOLO_OFFLINE=1
export YOLO_AUTOINSTALL=0
export MLFLOW_DISABLE_TELEMETRY=true
export DO_NOT_TRACK=1
export RAY_USAGE_STATS_ENABLED=0
export YOLO_CONFIG_DIR=$(TMPENV)/yolo
export MPLCONFIGDIR=$(TMPENV)/mpl

.PHONY: venv demo lint test test-fast browser clean-demo

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	mkdir -p $(TMPENV)
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(BIN)/python pipelines/demo.py

# The audit report is checked in a real browser: Debian's chromium (never `playwright install`).
browser:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two pytest-xdist workers; tests/conftest.py says what runs together and first.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

test: lint browser
	$(BIN)/python -m pytest -q $(XDIST) --durations=25

test-fast: lint browser
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow"

clean-demo:
	rm -rf runs/demo
