# Two commands do all set-up on a fresh machine with only Python 3.11:
#   make demo   -> creates .venv, installs fourfold, runs the embedded default (fourfold demo)
#   make test   -> creates .venv, installs fourfold with its test extras, runs ruff and the suite
# CPU machines get the pinned CPU wheel of torch (a bare `torch` could pull a multi-GB CUDA
# build); on a GPU machine install your own torch into .venv first, or set TORCH_SPEC.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fourfold-installed

.PHONY: install demo test test-slow bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold demo $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check fourfold tests benchmarks tools
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n 2 --dist loadfile $(ARGS)

test-slow: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m slow $(ARGS)

bench: $(STAMP)
	$(PY) benchmarks/ppo_iteration.py

clean:
	rm -rf $(VENV) runs
