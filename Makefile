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

.PHONY: install demo smoke docs test coverage bench clean

install: $(VENV)/.installed

# torch is installed first and pinned: 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: install
	$(PRETRAIN) fetch configs/demo.toml
	$(PRETRAIN) run configs/demo.toml

smoke: install
	$(PRETRAIN) run configs/smoke.toml

# The documentation site (mkdocs.yml, docs/): a broken link or anchor, or a page missing from the nav, fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

test: install docs
	$(VENV)/bin/lint-imports
	$(PYTEST)

coverage: install
	$(PYTEST) --cov --cov-report=term:skip-covered --cov-report=xml

bench: install
	$(PY) benchmarks/demo_wall_time.py

clean:
	rm -rf runs build/site
