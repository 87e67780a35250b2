"""The generated project works: its own test suite passes, and sample data -> Beam -> TFRecords ->
training on 8 CPU replicas -> evaluation reaches the accuracy its README promises."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import VENV, project_env


def make(project, *targets, timeout=1800):
    result = subprocess.run(["make", *targets, f"VENV={VENV}"], cwd=project, env=project_env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"make {' '.join(targets)} failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def set_up_project(default_project):
    """`make setup` into the shared virtualenv: installs the baked project and its dev tools."""
    make(default_project, "setup")
    return default_project


def test_generated_project_tests_pass(set_up_project):
    output = make(set_up_project, "test")
    assert " passed" in output and " failed" not in output


def run_end_to_end(project, *train_args):
    make(project, "data")
    preprocess = make(project, "preprocess")
    assert "rejected 2" in preprocess  # the sample's two broken files, listed in rejected.jsonl
    manifest = json.loads((project / "data/tfrecords/manifest.json").read_text())
    assert manifest["splits"]["train"]["num_examples"] + manifest["splits"]["eval"]["num_examples"] == 1200
    train = make(project, "train", f"ARGS={' '.join(train_args)}")
    assert "MirroredStrategy on CPU, 8 replicas" in train
    evaluate = make(project, "eval", f"ARGS={' '.join(train_args)}")
    assert "eval accuracy" in evaluate
    run = project / "runs/local"
    assert (run / "config.yaml").exists() and list((run / "logs/train").glob("events.out.tfevents.*"))
    assert list((run / "checkpoints").glob("ckpt-*.index"))
    return json.loads((run / "metrics.json").read_text())


def test_end_to_end_on_cpu_reaches_the_promised_accuracy(set_up_project):
    """data -> preprocess -> train -> eval with configs/local.yaml as shipped (auto steps_per_execution)."""
    metrics = run_end_to_end(set_up_project)
    assert metrics["global_step"] == 400
    assert metrics["accuracy"] >= 0.9
