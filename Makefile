# Two commands do all the set-up on a fresh machine:  make demo   and   make test
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 is a local CPU build on these machines; never let pip pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv test lint demo bench docs clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]" "$(TORCH_SPEC)"
	touch $@

venv: $(BIN)/.installed

lint: venv
	$(BIN)/ruff check meshshard tests benchmarks examples

# pytest-xdist workers: 2 on the 2-core CI machine (12.9 -> 8.8 min of pytest there); the
# multi-rank tests spawn their own ranks, so more workers than cores only adds contention.
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25 tests

# the manual (docs/ -> build/site) with warnings as errors: broken links, pages missing from
# the nav, docstrings that do not parse; the docs extra is installed on first use
$(BIN)/.docs-installed: $(BIN)/.installed pyproject.toml
	$(BIN)/python -m pip install -q -e ".[docs]" "$(TORCH_SPEC)"
	touch $@

docs: $(BIN)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # not --quiet: with it mkdocs 1.6 ignores --strict

# DEMO_ARGS: options of `meshshard demo` (e.g. DEMO_ARGS="--cells 2000 --steps 3")
DEMO_ARGS ?=

demo: venv
	$(BIN)/meshshard demo $(DEMO_ARGS)

# quick sizes; docs/benchmarks.md lists the full-size commands
bench: venv
	$(BIN)/python benchmarks/bench_partition.py --sizes 1e6
	$(BIN)/python benchmarks/bench_shardtensor.py --points 1000,100000
	$(BIN)/python benchmarks/bench_memory.py --points 2e5
	$(BIN)/python benchmarks/bench_ops.py --n 200000
	$(BIN)/python benchmarks/bench_pipeline.py --cells 500000
	$(BIN)/python benchmarks/bench_preprocess_workers.py --runs 2 --cells 200000 --repeat 1
	$(BIN)/python benchmarks/bench_gnn.py --cells 100000 --ranks 1,2
	$(BIN)/python benchmarks/bench_scale.py --sizes 2e6 --ranks 1 2

clean:
	rm -rf $(VENV) build *.egg-info
