# The template's own commands. Each creates the virtualenv it needs (.venv, shared by the baked projects).
#   make demo   bake a project with the default answers into build/demo/ and run it end to end on the CPU
#   make test   the template's test suite: bake every option, run the generated project's own tests and
#               an end-to-end run of it
SHELL := bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
TEMPLATE := {{cookiecutter.project}}
DEMO := build/demo/tpu-trainer
PYTEST_ARGS ?=

.PHONY: demo test venv clean

$(VENV)/.installed: requirements-test.txt $(TEMPLATE)/requirements.txt $(TEMPLATE)/requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-test.txt \
		-r $(TEMPLATE)/requirements.txt -r $(TEMPLATE)/requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

test: venv
	$(VENV)/bin/python -m pytest -q tests $(PYTEST_ARGS)

demo: venv
	rm -rf build/demo
	$(VENV)/bin/cookiecutter --no-input --output-dir build/demo .
	$(MAKE) -C $(DEMO) setup VENV=$(VENV)
	$(MAKE) -C $(DEMO) data preprocess train eval VENV=$(VENV)
	@echo "demo done: $(DEMO)/runs/local/metrics.json"; cat $(DEMO)/runs/local/metrics.json

clean:
	rm -rf build .venv
