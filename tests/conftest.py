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


def pytest_collection_modifyitems(items):
    """test_generated.py first, in its own order: its four runs take 3-8 minutes each. make test's
    pytest-xdist workers (worksteal) each take half of the collected list and steal from the tail
    of the other's, so collected first these spread over both workers instead of one of them
    starting last and running on alone."""
    items.sort(key=lambda item: item.path.name != "test_generated.py")  # stable


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
