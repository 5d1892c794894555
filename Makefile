# One-command setup for a fresh machine: each target creates .venv and installs what it needs.
# CPU machines: torch is pinned to the CPU build first (a bare `torch` requirement would pull a
# multi-GB CUDA build). On a GPU machine use e.g. `make test TORCH_SPEC=torch`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install demo test test-fast lint bench clean

$(BIN)/dlmkit: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(BIN)/dlmkit

install: $(BIN)/dlmkit

# The embedded default config: bd3lm's 6000 steps at most, ended by early stopping once the
# bundled task is learned.
demo: install
	$(BIN)/dlmkit train

test: install
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check dlmkit tests bench

bench: install
	$(BIN)/python bench/masks.py training

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
