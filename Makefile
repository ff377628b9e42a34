# pretrain — the two commands a new user needs:
#   make demo   # venv + install + fetch the Debian demo corpus + the whole chain on CPU
#   make test   # venv + install + the layering check + the test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PRETRAIN := $(VENV)/bin/pretrain

.PHONY: install demo smoke test bench clean

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

test: install
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/demo_wall_time.py

clean:
	rm -rf runs
