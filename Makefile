# pretrain — the two commands a new user needs:
#   make demo   # venv + install + fetch the Debian demo corpus + the whole chain on CPU
#   make test   # venv + install + the docs site (--strict) + the layering check + the test suite (what CI runs)
#   make coverage  # the test suite under coverage.py (line coverage of flows, tasks, models, evals, infra)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PRETRAIN := $(VENV)/bin/pretrain
# pytest-xdist workers: one per core; each test file runs on one worker (its module fixtures are made once).
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# The DuckDB 1.x command-line shell, in a venv of its own (the project's venv keeps its own duckdb package): the
# tests open the warehouse with it, as a user's DuckDB 1.x tools would (docs/duckdb.md, "Which DuckDB opens it").
DUCKDB_CLI_VERSION ?= 1.5.6
DUCKDB_CLI_VENV    ?= $(VENV)-duckdb-cli
export PRETRAIN_DUCKDB_CLI := $(abspath $(DUCKDB_CLI_VENV))/bin/duckdb

.PHONY: install duckdb-cli demo smoke docs test coverage bench clean

install: $(VENV)/.installed

# torch is installed first and pinned: 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	@echo "install: a venv in $(VENV), then torch 2.13.0 (CPU build) and the platform's dependencies (5-10 min the first time)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "install: torch 2.13.0, CPU build (~200 MB download)"
	$(PY) -m pip install --quiet torch==2.13.0
	@echo "install: pretrain and its dependencies (Prefect, MLflow, DuckDB, transformers, Ray, ...)"
	@# setuptools reports each editable install of a layout with several top-level packages as a warning
	@# ("Editable installation ... folders in your working directory with the same name"), which pip prints:
	@# it is information only, so the filter drops that one message and keeps every other warning.
	PYTHONWARNINGS='ignore:Editable installation:UserWarning' $(PY) -m pip install --quiet -e '.[test]'
	@echo "install: done"
	touch $@

duckdb-cli: $(DUCKDB_CLI_VENV)/.installed-$(DUCKDB_CLI_VERSION)

# The stamp names the version: changing DUCKDB_CLI_VERSION installs that one.
$(DUCKDB_CLI_VENV)/.installed-$(DUCKDB_CLI_VERSION):
	$(PYTHON) -m venv $(DUCKDB_CLI_VENV)
	$(DUCKDB_CLI_VENV)/bin/python -m pip install --quiet 'duckdb-cli==$(DUCKDB_CLI_VERSION)'
	touch $@

demo: install
	$(PRETRAIN) fetch configs/demo.toml
	$(PRETRAIN) run configs/demo.toml

smoke: install
	$(PRETRAIN) run configs/smoke.toml

# The documentation site (mkdocs.yml, docs/): a broken link or anchor, or a page missing from the nav, fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

test: install duckdb-cli docs
	$(VENV)/bin/lint-imports
	$(PYTEST)

coverage: install duckdb-cli
	$(PYTEST) --cov --cov-report=term:skip-covered --cov-report=xml

bench: install
	$(PY) benchmarks/demo_wall_time.py

clean:
	rm -rf runs build/site
