# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Each target installs what it uses into .venv: `make demo` the service, the workloads and
# TensorBoard (`pip install -e '.[service,workloads,tensorboard]'`: every run folder of the demo
# gets its event files), `make lab` the lab, `make docs` the site's tools only (the `docs` extra,
# without torch), `make test` everything.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH := $(VENV)/.torch
PIN := $(VENV)/torch-pin.txt
# --no-compile: pip would turn every installed .py file into bytecode (torch, ray, lightning:
# about a minute of CPU on a 2-core machine); Python compiles, once, only what is imported
PIP := $(PY) -m pip install --quiet --no-compile
# ... which needs Python to write that bytecode: many CI images set PYTHONDONTWRITEBYTECODE, and
# each of the suite's ~1,000 Python processes would then compile torch and dyntrain from source
# again (importing torch and torch._dynamo: 13.4 s of CPU instead of 4.8 s, measured at load 5)
unexport PYTHONDONTWRITEBYTECODE
DEMO_STAMP := $(VENV)/.demo-installed
DOCS_STAMP := $(VENV)/.docs-installed
LAB_STAMP := $(VENV)/.lab-installed
STAMP := $(VENV)/.installed

.PHONY: demo demo-elastic demo-images screenshots lab test browser lint docs bench-report clean

$(TORCH):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch 2.13.0 (CPU) lies on this machine's disk; a bare `torch` would pull a CUDA build.
	$(PIP) "torch==2.13.0" || $(PIP) "torch>=2.3,<2.15"
	# pin what was installed: without it pip's resolver may swap it for another build (on this
	# machine `pip install -e .[dev]` replaced 2.13.0+cpu by a 2.14.1 CUDA build of 3 GB)
	$(PY) -W ignore -c "import torch; print('torch==' + torch.__version__)" > $(PIN)
	touch $(TORCH)

$(DEMO_STAMP): pyproject.toml $(TORCH)
	$(PIP) -c $(PIN) -e ".[service,workloads,tensorboard]"
	touch $(DEMO_STAMP)

# the site needs MkDocs and its plugins, not dyntrain nor torch (the API reference is read from
# src/ without importing it): the `docs` extra's requirements alone, read from pyproject.toml
$(DOCS_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
	touch $(DOCS_STAMP)

$(LAB_STAMP): pyproject.toml $(TORCH)
	$(PIP) -c $(PIN) -e ".[lab]"
	touch $(LAB_STAMP)

# everything: every extra and the test tools
$(STAMP): pyproject.toml $(TORCH)
	$(PIP) -c $(PIN) -e ".[dev]"
	touch $(STAMP)

# DEMO_ARGS=--no-keep-serving: end after the summary instead of serving the dashboard until Ctrl-C
demo: $(DEMO_STAMP)
	$(PY) examples/service_demo.py --out runs/service-demo $(DEMO_ARGS)

# The dashboard's screenshots in docs/screenshots, taken by the demo while its job runs.
screenshots: $(STAMP) browser
	$(PY) examples/service_demo.py --out runs/service-demo --screenshots docs/screenshots \
		--no-keep-serving

demo-elastic: $(DEMO_STAMP)
	$(PY) examples/demo.py --out runs/demo

# The input pipeline and the recipe on a real image task read from disk: digits as JPEGs, packed
# into shards, a small ResNet with the article's recipe, 2 workers x 2 loader processes each.
demo-images: $(DEMO_STAMP)
	rm -rf runs/demo-images
	$(PY) -m dyntrain.workloads.digits_images runs/demo-images/jpeg
	$(VENV)/bin/dyntrain data pack runs/demo-images/jpeg/train runs/demo-images/packed/train
	$(VENV)/bin/dyntrain data pack runs/demo-images/jpeg/val runs/demo-images/packed/val
	$(VENV)/bin/dyntrain run --workers 2:2 --out runs/demo-images/run \
		-m dyntrain.workloads.imagenet --data runs/demo-images/packed --recipe digits-resnet \
		--loader-workers 2 --val-every-epochs 4

# The scaling lab on digits: the quick sweep (resumable), B_simple from two elastic runs, report.
NOISE_RUN := --workers 2:2 --quiet -m dyntrain.workloads.digits --model mlp --lr-schedule constant \
	--weight-decay 0 --global-batch 64 --chunk-size 8 --epochs 100 --max-steps 400 --noise-scale
lab: $(LAB_STAMP)
	$(VENV)/bin/dyntrain lab sweep --preset quick --service none --out runs/lab/sweep
	rm -rf runs/lab/noise-sgd runs/lab/noise-nesterov
	$(VENV)/bin/dyntrain run --out runs/lab/noise-sgd $(NOISE_RUN) --optimizer sgd --lr 0.3
	$(VENV)/bin/dyntrain run --out runs/lab/noise-nesterov $(NOISE_RUN) --optimizer nesterov \
		--lr 0.1 --momentum 0.9
	$(VENV)/bin/dyntrain lab report runs/lab/sweep --out runs/lab/report \
		--noise sgd=runs/lab/noise-sgd/metrics.jsonl \
		--noise nesterov=runs/lab/noise-nesterov/metrics.jsonl

# The browser tests drive Debian's Chromium (Playwright's own download needs the internet):
# installed here when missing and we may (CI runs as root); otherwise those tests skip.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq >/dev/null \
		&& apt-get install -y -qq chromium >/dev/null; }; }; } \
		|| echo "chromium could not be installed: the browser tests will skip"

# Three test processes (pytest-xdist), each taking whole files (module-scoped servers and clusters
# start once). Most end-to-end tests wait on other processes (heartbeat timeouts, held jobs,
# clusters starting): with two the 2 cores stood idle 17% of the time, with three the suite ends
# ~7% sooner. The files go out heaviest first (tests/durations.txt; tests/conftest.py orders them).
TEST_PROCS ?= 3
# PYTEST_ARGS: more pytest arguments (e.g. --junitxml=report.xml for every test's time)
PYTEST_ARGS ?=

test: $(STAMP) browser
	$(PY) -m pytest -q -n $(TEST_PROCS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS) tests

# The documentation site (MkDocs with Material; the API reference from the docstrings) into
# build/site; nothing is fetched while it builds. `make test` builds it too, strictly.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# docs/benchmarks/*.md from bench/results/*.json (tests/test_docs.py checks they are up to date)
bench-report:
	$(PYTHON) bench/report.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples tools

# moto's AWS Batch test suite against a dyntrain server (tools/moto_batch/run.py says how;
# MOTO_ARGS="-k NAME" passes pytest arguments).
# moto's tests come from its source distribution on PyPI at run time, into build/moto-batch;
# moto itself (the embedded server answering the EC2/IAM setup calls) gets a venv of its own.
MOTO_VERSION ?= 5.2.5
MOTO_WORK := build/moto-batch
MOTO_VENV := build/moto-venv
moto-batch: $(STAMP)
	test -x $(MOTO_VENV)/bin/python || $(PYTHON) -m venv $(MOTO_VENV)
	$(MOTO_VENV)/bin/python -m pip install --quiet "moto==$(MOTO_VERSION)" flask flask-cors pytest
	rm -rf $(MOTO_WORK) && mkdir -p $(MOTO_WORK)
	$(MOTO_VENV)/bin/python -m pip download --quiet --no-binary :all: --no-deps \
		"moto==$(MOTO_VERSION)" -d $(MOTO_WORK)
	tar -xzf $(MOTO_WORK)/moto-$(MOTO_VERSION).tar.gz -C $(MOTO_WORK) \
		moto-$(MOTO_VERSION)/tests/__init__.py moto-$(MOTO_VERSION)/tests/conftest.py \
		moto-$(MOTO_VERSION)/tests/markers.py moto-$(MOTO_VERSION)/tests/test_batch
	$(MOTO_VENV)/bin/python tools/moto_batch/run.py --moto-version $(MOTO_VERSION) \
		--tests $(MOTO_WORK)/moto-$(MOTO_VERSION)/tests --dyntrain $(VENV)/bin/dyntrain \
		--work $(MOTO_WORK) -- $(MOTO_ARGS)

clean:
	rm -rf runs .pytest_cache build
