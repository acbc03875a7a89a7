# Two commands do all set-up on a fresh machine with only Python 3.11:
#   make demo   -> creates .venv, installs fourfold, runs the embedded default (fourfold demo)
#   make test   -> creates .venv, installs fourfold with its test extras, runs ruff and the suite
#   make results -> reruns the demo (3 seeds, full and quick), the arithmetic demo (3 seeds), the claims
#                  sweep, the horizon, overoptimization, turns, staleness and warm-up families, the practice and the measurement
#                  sweeps (about 8 hours on 2 cores), collects results/*.json and rewrites every published figure of README.md, docs/demo.md,
#                  docs/arithmetic.md, docs/experiments.md and docs/correction.md (make publish: the last step only)
# CPU machines get the pinned CPU wheel of torch (a bare `torch` could pull a multi-GB CUDA
# build); on a GPU machine install your own torch into .venv first, or set TORCH_SPEC.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fourfold-installed

.PHONY: install demo test test-slow bench results publish clean

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

# Every published figure from fresh runs (fourfold/apps/publish.py). The claims sweep reuses the seed-0
# demo's cached stages (same settings), so its demo stages are not trained twice.
SEEDS ?= 0 1 2
results: $(STAMP)
	for s in $(SEEDS); do HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold demo --output-dir runs/demo-s$$s --seed $$s run.concurrent_roles=false || exit 1; done
	for s in $(SEEDS); do HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold demo --quick --output-dir runs/demo-quick-s$$s --seed $$s || exit 1; done
	for s in $(SEEDS); do HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold demo --task arithmetic --output-dir runs/demo-arithmetic-s$$s --seed $$s || exit 1; done
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold experiments --config examples/experiments.yaml demo.run.output_dir=runs/demo-s0
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold experiments --config examples/horizon.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold experiments --config examples/overoptimization.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold experiments --config examples/turns.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold experiments --config examples/practice.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold experiments --config examples/measure.yaml demo.run.output_dir=runs/demo-s0
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold experiments --config examples/staleness.yaml demo.run.output_dir=runs/demo-s0
	HF_HUB_OFFLINE=1 $(VENV)/bin/fourfold experiments --config examples/warmup.yaml
	$(PY) -m fourfold.apps.publish collect
	$(PY) -m fourfold.apps.publish render

publish: $(STAMP)
	$(PY) -m fourfold.apps.publish render

clean:
	rm -rf $(VENV) runs
