# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-elastic lab test lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch 2.13.0 (CPU) lies on this machine's disk; a bare `torch` would pull a CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0" || $(PY) -m pip install --quiet "torch>=2.3,<2.15"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/service_demo.py --out runs/service-demo

demo-elastic: $(STAMP)
	$(PY) examples/demo.py --out runs/demo

# The scaling lab on digits: the quick sweep (resumable), B_simple from two elastic runs, report.
NOISE_RUN := --workers 2:2 --quiet -m dyntrain.workloads.digits --model mlp --lr-schedule constant \
	--weight-decay 0 --global-batch 64 --chunk-size 8 --epochs 100 --max-steps 400 --noise-scale
lab: $(STAMP)
	$(VENV)/bin/dyntrain lab sweep --preset quick --service none --out runs/lab/sweep
	rm -rf runs/lab/noise-sgd runs/lab/noise-nesterov
	$(VENV)/bin/dyntrain run --out runs/lab/noise-sgd $(NOISE_RUN) --optimizer sgd --lr 0.3
	$(VENV)/bin/dyntrain run --out runs/lab/noise-nesterov $(NOISE_RUN) --optimizer nesterov \
		--lr 0.1 --momentum 0.9
	$(VENV)/bin/dyntrain lab report runs/lab/sweep --out runs/lab/report \
		--noise sgd=runs/lab/noise-sgd/metrics.jsonl \
		--noise nesterov=runs/lab/noise-nesterov/metrics.jsonl

test: $(STAMP)
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples

clean:
	rm -rf runs .pytest_cache
