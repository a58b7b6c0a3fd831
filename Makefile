# Two entry points for a fresh machine with only Python 3: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench clean

run: $(VENV)/.installed
	$(BIN)/trainsim run

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check .

bench: $(VENV)/.installed
	for f in bench/*.py; do $(BIN)/python $$f || exit 1; done

# torch first, pinned to the CPU build, so that no dependency resolution pulls a multi-GB CUDA wheel.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
