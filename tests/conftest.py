"""Bakes projects from this template (every option) for the tests; one shared virtualenv runs them."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = json.loads((ROOT / "cookiecutter.json").read_text())
TPU_TYPES = OPTIONS["tpu_type"]
TASKS = OPTIONS["task"]
VENV = Path(sys.prefix)  # the template's .venv, shared with every baked project


def bake(output_dir: Path, template: Path = ROOT, **answers) -> Path:
    """Generates a project without prompts (from this template, or a clone of it); returns its directory."""
    return Path(cookiecutter(str(template), no_input=True, output_dir=str(output_dir), extra_context=answers))


# What an outer `make test` leaves in the environment: a baked project's make must not see it (at
# MAKELEVEL 1 it would print "Entering/Leaving directory" around each target's output).
OUTER_MAKE = ("PYTHONPATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def project_env() -> dict:
    """Environment for running a baked project's make targets with the shared virtualenv."""
    env = {key: value for key, value in os.environ.items() if key not in OUTER_MAKE}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env['PATH']}"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


# Seconds each of the longest tests took in a clean-clone `make test` (2 cores, two workers).
LONGEST = {
    "test_language_project_tests_pass": 912,
    "test_text_project_tests_pass": 743,
    "test_generated_project_tests_pass": 554,
    "test_each_other_tasks_bake_runs_its_targets[text_classification]": 531,
    "test_each_other_tasks_bake_runs_its_targets[language_model]": 513,
    "test_the_tpu_vms_tensorflow_set_passes_its_tests_and_trains": 440,
    "test_a_task_copied_from_the_language_model_trains_beside_it_and_its_tests_pass": 324,
}


def pytest_collection_modifyitems(config, items):
    """The longest tests spread over make test's pytest-xdist workers, each at the head of one.
    worksteal hands worker k the k-th contiguous part of the collected list and then lets an idle
    worker steal from the tail of another's: a long test collected late, or several in one part,
    would run on alone at the end. So each long test goes to the part whose long tests sum least so
    far (longest first), the other tests fill the parts in their collected order, and the parts are
    collected one after the other. In one process (-n 0) the order is the files'."""
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers < 2:
        return
    long = sorted((item for item in items if item.name in LONGEST), key=lambda item: -LONGEST[item.name])
    parts, load = [[] for _ in range(workers)], [0] * workers
    for item in long:
        k = load.index(min(load))
        parts[k].append(item)
        load[k] += LONGEST[item.name]
    rest = iter(item for item in items if item.name not in LONGEST)
    left = len(items)
    for k, part in enumerate(parts):  # worksteal's split: what is left, divided by the workers left
        size = left // (workers - k)
        left -= size
        part.extend(item for _, item in zip(range(max(0, size - len(part))), rest))
    parts[-1].extend(rest)
    items[:] = [item for part in parts for item in part]


@contextlib.contextmanager
def shared_venv_lock():
    """One `make setup` at a time into the shared virtualenv: the suite runs on several pytest
    workers, and two pip installs of the same project into one environment race."""
    with open(VENV / ".setup.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def default_project(tmp_path_factory) -> Path:
    return bake(tmp_path_factory.mktemp("default"), gcp_project="acme-ml-research", zone="us-central2-b",
                gcs_bucket="acme-tpu-data")
