# Two commands a new user runs (see README): `make demo` and `make test`.
# Each creates the virtual environment itself when it is absent.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlvr-installed

.PHONY: demo test test-slow test-ray lint bench bench-vs-trl studies clean-venv

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

# The source documents' claims measured (docs/studies/): each study is one command, minutes on 2 cores.
studies: $(STAMP)
	for s in one_minus_1_over_g std_normalization length_normalization off_policy thinking_budget; do \
		$(BIN)/python benchmarks/studies/$$s.py || exit 1; done

# rlvr vs TRL's GRPOTrainer, interleaved (docs/benchmarks.md); TRL comes with the bench extra
bench-vs-trl: $(STAMP)
	$(BIN)/pip install --disable-pip-version-check -q -e ".[bench]"
	$(BIN)/python benchmarks/vs_trl.py

# Ray placement tests (one local Ray cluster, 2 CPUs, about 3 min); installs the ray extra first.
test-ray: $(STAMP)
	$(BIN)/pip install --disable-pip-version-check -q -e ".[ray]"
	$(BIN)/python -m pytest -q -m ray

lint: $(STAMP)
	$(BIN)/ruff check rlvr tests benchmarks scripts

clean-venv:
	rm -rf $(VENV)

.PHONY: bench-step
bench-step: $(STAMP)
	$(BIN)/python benchmarks/step.py --compare algo.shared_prefix=false --compare rollout.shared_prefix=false
