# Every target sets up .venv itself, so a fresh clone needs nothing but Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make demo` installs only the demo extra (its servers, the collector's client, the
# CLI's tables); the checks install the dev and docs extras. Each reinstalls when pyproject changes.
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: test lint typecheck unit docs chromium nemo-gym nemo-gym-test bench fuzz demo clean dist wheel-test test-loaded

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
	$(BIN)/ruff check src tests benchmarks mkdocs_hooks.py docs/api/_summaries.py
	$(BIN)/ruff format --check src tests benchmarks mkdocs_hooks.py docs/api/_summaries.py

typecheck: $(STAMP)
	$(BIN)/mypy src tests benchmarks mkdocs_hooks.py docs/api/_summaries.py

# The HTML report's test renders it in headless Chromium (Debian's package). It is installed here
# when missing, as `make bench` does for wrk; where it cannot be (no root, no apt) this target, and
# so `make test`, fails: the test never skips.
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
	  || (echo "chromium is missing and could not be installed (apt-get install chromium)" >&2; exit 1)

# The NeMo Gym peer tests have their own target (`make nemo-gym-test`, which `.ci/run` runs after
# `make test`): with them `make test` took past the five minutes issue 19 set as the bound for keeping them in.
# Two xdist workers (pytest-xdist, in the dev extra), each test file whole on one and the Ray tests all on
# one (tests/conftest.py): issue 33's bound of 6 minutes on two cores. `make unit XDIST=` runs one process.
XDIST ?= -n 2 --dist loadfile
unit: $(STAMP) chromium
	$(BIN)/pytest --ignore=tests/nemo_gym_peer $(XDIST)

# `make unit`'s tests (the Ray tests and those that run servers and commands as processes among them)
# with one core kept busy by another process, as on CI's busy machine (issue 33): tests/load.py spins on
# the last core the run may use, beside the run.
test-loaded: $(STAMP) chromium
	$(BIN)/python -m tests.load --busy 1 -- $(BIN)/pytest --ignore=tests/nemo_gym_peer $(XDIST)

# The API reference site, built from the docstrings; --strict fails on any broken reference or anchor
# (not with --quiet, which hides the warnings --strict counts: a broken anchor passed with it).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir $(VENV)/site

test: lint typecheck docs unit

# The fuzz targets (tests/fuzz) and the decoders' other property tests with 20,000 examples each:
# minutes, not part of `make test`, which runs them with hypothesis's default budget. The summary's
# differential tests (a DuckDB query per example) run the longer budget `tests.strategies.examples` names.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest tests/fuzz tests/test_failure_header.py tests/test_redaction.py tests/test_rows.py \
	  tests/test_readers_agree.py \
	  tests/test_nemo_gym.py::test_the_summarys_sql_counts_every_row_as_python_reads_it

# The benchmark extra: llmock for the side-by-side endpoint figures, and uvloop with httptools, so
# each loop and parser is measured as the extras that run them install it (the ray extra's workers
# and `collect` on uvloop, `serve model` and the middleware on uvloop + httptools beside asyncio + h11).
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,benchmark]'
	touch $(BENCH_STAMP)

# agentbreak 0.4.6, the proxy's side-by-side peer (benchmarks/bench_proxy.py), in a venv of its own:
# installed as a user installs it (asyncio + h11, its typer and pyyaml), not beside our uvloop.
AB_VENV := .venv-bench-agentbreak
$(AB_VENV)/.installed:
	$(PYTHON) -m venv $(AB_VENV)
	$(AB_VENV)/bin/python -m pip install --quiet --disable-pip-version-check agentbreak==0.4.6
	touch $@

# wrk drives the under-uvicorn middleware figures; without it (no root, no apt) they are skipped.
bench: $(BENCH_STAMP) $(AB_VENV)/.installed
	command -v wrk >/dev/null || apt-get install -y -qq wrk >/dev/null 2>&1 || echo "wrk unavailable: skipping the under-uvicorn figures"
	$(BIN)/python -m benchmarks

demo: $(DEMO_STAMP)
	$(BIN)/gym-failures demo

# The release's files (issue 33): the sdist, and the wheel built from it, into dist/ (gitignored);
# twine check --strict refuses the metadata or a README PyPI would not take or render.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist
	$(BIN)/twine check --strict dist/*

# What a user gets from the wheel (issue 33): it goes with the demo extra into a fresh venv in a temp
# directory, never editable; the commands run from there, without PYTHONPATH, so neither src/ nor the
# checkout is importable and the demo's runs/ lands there too. `demo` exits 0 when it ran: its gate
# FAILs the faulted run on purpose, and that verdict is printed, not returned (cli/_exits.py).
wheel-test: dist
	@set -eu; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  wheel=$$(ls "$(CURDIR)"/dist/*.whl); \
	  $(PYTHON) -m venv "$$tmp/venv"; \
	  echo "installing $$(basename "$$wheel")[demo] into a fresh venv"; \
	  "$$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$$wheel[demo]"; \
	  "$$tmp/venv/bin/python" -m pip check --disable-pip-version-check; \
	  cd "$$tmp"; unset PYTHONPATH; \
	  "$$tmp/venv/bin/python" -c 'import gym_failures as g, sys; print(g.__file__); \
	    assert g.__file__.startswith(sys.prefix + "/"), "imported from outside the fresh venv"'; \
	  set -x; \
	  "$$tmp/venv/bin/gym-failures" --version; \
	  "$$tmp/venv/bin/gym-failures" --help >/dev/null; \
	  "$$tmp/venv/bin/gym-failures" serve proxy --help >/dev/null; \
	  "$$tmp/venv/bin/gym-failures" demo; \
	  test -s "$$tmp"/runs/*/report.html

clean:
	rm -rf $(VENV) $(NG_VENV) $(AB_VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
