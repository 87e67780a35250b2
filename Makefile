# The template's own commands. Each creates the virtualenv it needs (.venv, shared by the baked projects).
#   make demo   bake a project with the default answers into build/demo/ and run it end to end on the CPU
#   make test       the template's test suite (what CI runs): every option baked, the hooks, the template
#                   update, each bake's fast tests, and the end-to-end runs (both classification tasks, a task added with make new-task, every make target of the default bake, each other task's bake through its data, train, eval, predict, doctor, benchmark and DRY_RUN targets, and a bake on the TPU VM's TensorFlow set: make setup TF=2.19, the fast-tier files that reach what moves between the sets, a short train)
#   make test-fast  the same without the end-to-end runs (pytest -m "not slow")
#   make test-release  each bake's make test-full (less the TPU tests), the whole fast tier on the TPU VM's TensorFlow set,
#                   each bake's real-data recipe against its README's figure, and the language-model bake's make mutate,
#                   kept out of make test (pytest -m release): about three hours
#   make lint       ruff on the template's Python files (tools/ruff_template.py); make format applies it
SHELL := bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
TEMPLATE := {{cookiecutter.project}}
DEMO := build/demo/tpu-trainer
PYTEST_ARGS ?=
# Parallel pytest workers (pytest-xdist; 0 runs in this process). Two halve the suite on 2 cores: most
# of a bake's run is single-threaded graph tracing, so the runs overlap well.
WORKERS ?= 2
PYTEST := $(VENV)/bin/python -m pytest -q -n $(WORKERS) --dist worksteal

.PHONY: demo test test-fast test-release lint format venv clean

$(VENV)/.installed: requirements-test.txt $(TEMPLATE)/requirements.txt $(TEMPLATE)/requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-test.txt \
		-r $(TEMPLATE)/requirements.txt -r $(TEMPLATE)/requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PYTEST) -m "not release" tests $(PYTEST_ARGS)

test-fast: venv
	$(PYTEST) -m "not slow and not release" tests $(PYTEST_ARGS)

test-release: venv
	$(PYTEST) -m release tests $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/python tools/ruff_template.py check --ruff $(VENV)/bin/ruff

format: venv
	$(VENV)/bin/python tools/ruff_template.py format --ruff $(VENV)/bin/ruff

demo: venv
	rm -rf build/demo
	$(VENV)/bin/cookiecutter --no-input --output-dir build/demo .
	$(MAKE) -C $(DEMO) setup VENV=$(VENV)
	$(MAKE) -C $(DEMO) data preprocess train eval VENV=$(VENV)
	@echo "demo done: $(DEMO)/runs/local/metrics.json"; cat $(DEMO)/runs/local/metrics.json

clean:
	rm -rf build .venv
