# Two commands on a fresh machine:  make cookbook   and   make test
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))

.PHONY: venv cookbook outputs test unit nbval e2e chromium lab bench bench-pytorch mutate clean
venv: $(STAMP)

# uv installs the pinned stack faster than pip (same versions: docs/measurements.md). --compile-bytecode: this
# machine sets PYTHONDONTWRITEBYTECODE=1, so without .pyc files every process would compile MindSpore and
# mindformers from source (the unit tests take about half as long again without them)
$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q $$(grep '^uv==' requirements.txt)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -r requirements.txt
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

# Execute every notebook in order, headless; executed copies go to build/notebooks/.
cookbook: $(STAMP)
	@mkdir -p build/notebooks
	@for nb in $(NOTEBOOKS); do \
	  echo "==> $$nb"; \
	  $(BIN)/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=900 \
	    --output-dir build/notebooks "$$nb" || exit 1; \
	done
	@echo; echo "Executed notebooks: $(CURDIR)/build/notebooks/"
	@echo "Run CSVs:           $(CURDIR)/build/runs/"
	@test ! -e build/report/report.html || echo "Evaluation report:  $(CURDIR)/build/report/report.html"

# Re-execute notebooks in place, in order, in one session, stamp each with the run's manifest (tests/run_outputs.py)
# and tidy their outputs, for committing (one at a time: they time things). Commit the run of all of them:
#   make outputs                      every notebook;   make outputs NB='notebooks/09_*.ipynb'   some (for iterating:
#                                     tests/test_notebook_outputs.py fails until every notebook comes from one run)
# A notebook that could not tell (a TOO NOISY line) stops the run there: OUTPUTS_ARGS=--keep-going runs the rest.
NB ?= $(NOTEBOOKS)
OUTPUTS_ARGS ?=
outputs: $(STAMP)
	$(BIN)/python tests/run_outputs.py $(OUTPUTS_ARGS) $(NB)
	$(BIN)/python tests/tidy_outputs.py $(NB)
	$(BIN)/pytest -q -p no:cacheprovider tests/test_notebook_outputs.py

test: unit nbval

# Unit tests on 2 xdist workers (work stealing: the long CLI and msrun cases are uneven). None of them times
# anything that a second worker could skew; the notebooks, which do, run one at a time under nbval.
UNIT_WORKERS ?= 2
unit: $(STAMP)
	$(BIN)/pytest -q --durations=25 -n $(UNIT_WORKERS) --dist worksteal tests --ignore=tests/e2e
	$(BIN)/pytest -q --doctest-modules mshelpers -rs

# Notebooks whose claims hold a measured time to a prediction or a planted slowdown (msrun collectives, the
# straggler, the doctor's CPU check) run alone, both cores theirs, after 00 (which measures and caches the
# MatMul peak the others read). The rest state timings only through verdicts computed from their own
# alternated rounds, so they run two at a time (one kernel per notebook).
NB_SOLO := notebooks/00_environment.ipynb notebooks/04_data_parallel.ipynb notebooks/05_semi_auto_parallel.ipynb notebooks/08_profiling.ipynb \
           notebooks/12_your_config.ipynb
# Longest first (pytest --durations in the nbval step shows each notebook's time two at a time),
# in this order: a free worker takes the next file, so the longest must not start last. NBVAL_PIN_CORES=1 keeps each
# worker, and every kernel and process it starts, to one core of its own (conftest.py): unpinned, the two kernels'
# thread pools trade both cores back and forth (docs/measurements.md says how that was compared). xdist would sort
# the files by cell count instead (09 has 11 cells), hence --no-loadscope-reorder.
NB_LONGEST := notebooks/10_stability.ipynb notebooks/02_graph_mode.ipynb notebooks/09_evaluation_report.ipynb \
              notebooks/06_recompute_memory.ipynb notebooks/03_mixed_precision.ipynb notebooks/07_mindir_aoe.ipynb
NB_PAIRED := $(NB_LONGEST) $(filter-out $(NB_SOLO) $(NB_LONGEST),$(NOTEBOOKS))
NBVAL := $(BIN)/pytest -q -p no:cacheprovider --nbval-lax --nbval-cell-timeout=900 --nbval-sanitize-with tests/nbval_sanitize.cfg
nbval: $(STAMP)
	$(NBVAL) --durations=5 $(NB_SOLO)
	NBVAL_PIN_CORES=1 $(NBVAL) --durations=10 -n 2 --dist loadfile --no-loadscope-reorder $(NB_PAIRED)

# The browser suite: JupyterLab and MindInsight driven in headless Chromium; screenshots go to build/e2e/.
# `timeout -s INT` is a last resort against a hang: SIGINT still lets pytest stop every server it started.
e2e: $(STAMP) chromium
	timeout -s INT -k 60 480 $(BIN)/pytest -q tests/e2e

# Debian's chromium for the e2e suite (Playwright drives it; `playwright install` downloads are not used).
chromium:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  echo "==> apt-get install chromium chromium-driver"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks

# PyTorch (CPU, pinned in bench/requirements.txt) is a benchmark-only extra; the cookbook never imports it.
bench: $(STAMP)
	$(BIN)/pip install -q -r bench/requirements.txt
	$(BIN)/python -m bench.compare_pytorch
	$(BIN)/python -m bench.profile_recipe
	$(BIN)/python -m bench.train_step_ablation
	@for b in bench/bench_*.py; do echo "==> $$b"; $(BIN)/python $$b || exit 1; done

bench-pytorch: $(STAMP)
	$(BIN)/pip install -q -r bench/requirements.txt
	$(BIN)/python -m bench.compare_pytorch

# Mutation testing of metrics, peak, memory, parallel (and pipeline, collectives, hardware, mindformers_yaml, shards),
# checkpoint, data and stability against their fast unit tests
# ([tool.mutmut] in pyproject.toml). Not part of CI: it takes hours on 2 cores. Score: tests/README.md.
# One module at a time:  make mutate MUTANTS='mshelpers.data.*'
MUTANTS ?=
# Bytecode on: every mutant's worker imports the mutated modules (memory.py grows to 14 MB), and compiling them
# from source took ~4 s of each worker's ~5 where PYTHONDONTWRITEBYTECODE=1 is set (this machine's default).
mutate: $(STAMP)
	$(BIN)/pip install -q -e '.[dev]'
	env -u PYTHONDONTWRITEBYTECODE PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/mutmut run $(MUTANTS)
	$(BIN)/mutmut results

clean:
	rm -rf build notebooks/output
