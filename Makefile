# Every target sets up .venv itself, so a fresh clone needs nothing but Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make demo` installs only the demo extra (its servers, the collector's client, the
# CLI's tables); the checks install the dev and docs extras. Each reinstalls when pyproject changes.
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: test lint typecheck unit docs chromium nemo-gym nemo-gym-test bench fuzz demo clean

# The real NeMo Gym 0.7.0, a test peer: its collector, resume, aggregation, record models and server
# classes run in their own Python 3.13 venv (0.7.0 asks for Python >= 3.13.14; pyenv's 3.13 runs it,
# hence --ignore-requires-python). Its requirements file pins what its modules import, as one working
# install resolved them; --no-deps keeps pip from chasing what the tests never import: mlflow, which 0.7.0
# imports only for its data preparation and dataset commands (nemo_gym/gitlab_utils.py: `gym eval run`
# without `--no-serve`, `gym dataset`) and its exporters; the peer tests run the code behind `--no-serve`.
# gym-failures goes in beside it, editable, for the tests whose NeMo Gym servers run our middleware.
PY313 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) $(shell command -v python3.13 2>/dev/null))
NG_VENV := .venv-nemo-gym
NG_STAMP := $(NG_VENV)/.installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	touch $(STAMP)

$(NG_STAMP): tests/nemo_gym_peer/requirements.txt pyproject.toml
	@test -n "$(PY313)" || (echo "Python 3.13 is missing: NeMo Gym 0.7.0 needs it (pyenv install 3.13, or make PY313=/path/to/python3.13)" >&2; exit 1)
	$(PY313) -m venv $(NG_VENV)
	$(NG_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --ignore-requires-python nemo-gym==0.7.0
	$(NG_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r tests/nemo_gym_peer/requirements.txt
	$(NG_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(NG_STAMP)

nemo-gym: $(NG_STAMP)

# The tests where the real NeMo Gym 0.7.0 does its part (tests/nemo_gym_peer), installing it first.
nemo-gym-test: $(STAMP) $(NG_STAMP)
	$(BIN)/pytest tests/nemo_gym_peer

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[demo]'
	touch $(DEMO_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks mkdocs_hooks.py
	$(BIN)/ruff format --check src tests benchmarks mkdocs_hooks.py

typecheck: $(STAMP)
	$(BIN)/mypy src tests benchmarks mkdocs_hooks.py

# The HTML report's test renders it in headless Chromium (Debian's package). It is installed here
# when missing, as `make bench` does for wrk; where it cannot be (no root, no apt) this target, and
# so `make test`, fails: the test never skips.
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
	  || (echo "chromium is missing and could not be installed (apt-get install chromium)" >&2; exit 1)

# The NeMo Gym peer tests have their own target (`make nemo-gym-test`, which `.ci/run` runs after
# `make test`): with them `make test` took past the five minutes issue 19 set as the bound for keeping them in.
unit: $(STAMP) chromium
	$(BIN)/pytest --ignore=tests/nemo_gym_peer

# The API reference site, built from the docstrings; --strict fails on any broken reference.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site

test: lint typecheck docs unit

# The fuzz targets (tests/fuzz) and the decoders' other property tests with 20,000 examples each:
# minutes, not part of `make test`, which runs them with hypothesis's default budget. The summary's
# differential tests (a DuckDB query per example) run the longer budget `tests.strategies.examples` names.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest tests/fuzz tests/test_failure_header.py tests/test_redaction.py tests/test_rows.py \
	  tests/test_nemo_gym.py::test_the_summarys_sql_counts_every_row_as_python_reads_it

# The benchmark extra: llmock for the side-by-side endpoint figures, and uvloop with httptools, so
# each loop and parser is measured as the extras that run them install it (the ray extra's workers
# and `collect` on uvloop, `serve model` and the middleware on uvloop + httptools beside asyncio + h11).
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,benchmark]'
	touch $(BENCH_STAMP)

# wrk drives the under-uvicorn middleware figures; without it (no root, no apt) they are skipped.
bench: $(BENCH_STAMP)
	command -v wrk >/dev/null || apt-get install -y -qq wrk >/dev/null 2>&1 || echo "wrk unavailable: skipping the under-uvicorn figures"
	$(BIN)/python -m benchmarks

demo: $(DEMO_STAMP)
	$(BIN)/gym-failures demo

clean:
	rm -rf $(VENV) $(NG_VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
