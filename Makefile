# windowkit — the two commands are `make demo` and `make test`; both set up .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.windowkit-installed
DEMO   := demo
# the PyTorch the suite runs on: a CPU build (pip finds 2.13.0+cpu on this project's
# machines); windowkit[torch] itself takes any torch>=2.2
TORCH  ?= torch==2.13.0
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install demo test test-slow lint typecheck docs bench bench-cores bench-memory bench-csv bench-convergence bench-gpu bench-remote bench-vs fixtures clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' '$(TORCH)'
	$(BIN)/python -m windowkit.native
	touch $(STAMP)

DEMO_FORMATS := tfrecord zarr parquet

demo: $(STAMP)
	rm -rf $(DEMO)
	for fmt in $(DEMO_FORMATS); do \
		$(BIN)/windowkit convert fixtures/sensors/*.npy --format $$fmt --out $(DEMO)/$$fmt \
			--window 32 --horizon 4 --quiet && \
		$(BIN)/windowkit inspect $(DEMO)/$$fmt && \
		$(BIN)/windowkit verify $(DEMO)/$$fmt && \
		$(BIN)/python fixtures/demo_train.py $(DEMO)/$$fmt || exit 1; \
	done

# tests run in TEST_WORKERS processes side by side (pytest-xdist; 2 fits the 2-core CI),
# an idle one taking tests queued for the other (worksteal: the durations are uneven)
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist worksteal

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

lint: $(STAMP)
	$(BIN)/ruff check windowkit tests fixtures

typecheck: $(STAMP)
	$(BIN)/mypy

# the documentation site (mkdocs-material, API reference from the docstrings) into site/
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python -m tests.benchmarks.benchmark throughput
	$(BIN)/python -m tests.benchmarks.benchmark shuffling
	$(BIN)/python -m tests.benchmarks.beyond_memory --mib 256
	$(BIN)/python -m tests.benchmarks.training --mib 256
	$(BIN)/python -m tests.benchmarks.benchmark forecasting
	$(BIN)/python -m tests.benchmarks.frameworks
	$(BIN)/python -m tests.benchmarks.ranks
	$(BIN)/python -m tests.benchmarks.perf_page

# each reader pinned to 1, 2, ... cores: windows/s and the speedup (docs/cores.md)
bench-cores: $(STAMP)
	$(BIN)/python -m tests.benchmarks.cores
	$(BIN)/python -m tests.benchmarks.perf_page

bench-memory: $(STAMP)
	$(BIN)/python -m tests.benchmarks.benchmark memory
	$(BIN)/python -m tests.benchmarks.perf_page

bench-csv: $(STAMP)
	$(BIN)/python -m tests.benchmarks.benchmark csv
	$(BIN)/python -m tests.benchmarks.perf_page

# validation loss of one model trained on each input order (docs/shuffling.md#convergence)
bench-convergence: $(STAMP)
	$(BIN)/python -m tests.benchmarks.convergence
	$(BIN)/python -m tests.benchmarks.perf_page

# the LSTM autoencoder trained on a CUDA GPU fed by each reader: steps/s and input wait
# (docs/performance.md#training-on-a-gpu); without a GPU it says so and exits 0
bench-gpu: $(STAMP)
	$(BIN)/python -m tests.benchmarks.gpu

bench-remote: $(STAMP)
	$(BIN)/python -m tests.benchmarks.remote --latency-ms 20

# this tree against an earlier release, side by side in one run: make bench-vs BASE=<git ref>
bench-vs: $(STAMP)
	@test -n "$(BASE)" || { echo "make bench-vs needs BASE=<git ref of the earlier release>"; exit 2; }
	$(BIN)/python -m tests.benchmarks.vs_release $(BASE)

fixtures: $(STAMP)
	$(BIN)/python fixtures/make_fixtures.py

clean:
	rm -rf $(VENV) $(DEMO) bench-out site .pytest_cache .mypy_cache .ruff_cache .hypothesis
