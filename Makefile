# Two commands do all the set-up on a fresh machine:  make demo   and   make test
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 is a local CPU build on these machines; never let pip pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv test lint demo bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]" "$(TORCH_SPEC)"
	touch $@

venv: $(BIN)/.installed

lint: venv
	$(BIN)/ruff check meshshard tests benchmarks examples

test: lint
	$(BIN)/python -m pytest -q tests

demo: venv
	$(BIN)/meshshard demo

bench: venv
	$(BIN)/python benchmarks/bench_partition.py

clean:
	rm -rf $(VENV) build *.egg-info
