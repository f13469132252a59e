# Two commands a new user runs (see README): `make demo` and `make test`.
# Each creates the virtual environment itself when it is absent.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlvr-installed

.PHONY: demo test test-slow lint bench clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch==2.13.0 first: any other spec pulls a multi-GB CUDA build on CPU machines.
	$(BIN)/pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/pip install --disable-pip-version-check -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rlvr demo

test: $(STAMP)
	$(BIN)/ruff check rlvr tests benchmarks scripts
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check rlvr tests benchmarks scripts

clean-venv:
	rm -rf $(VENV)

.PHONY: bench-step
bench-step: $(STAMP)
	$(BIN)/python benchmarks/step.py --compare algo.shared_prefix=false --compare rollout.shared_prefix=false
