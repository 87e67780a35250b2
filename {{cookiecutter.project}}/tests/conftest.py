"""Shared fixtures: small real data (the task's generated sample -> real Beam pipeline -> TFRecords) and a
CPU split into 8 logical devices, so that tests run the TPU code path with 8 replicas."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Sets the gs:// emulator's environment before TensorFlow is imported (see gcs_emulator.py).
pytest_plugins = ["gcs_emulator"]

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT / "src"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Nothing probes the real GCE metadata server: a closed loopback port answers at once, so the
# preemption watcher switches itself off and TensorFlow stays off-GCP (tests that need a metadata
# server start a fake one and point these at it).
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")
os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")

REPLICAS = 8
{%- if cookiecutter.task == "image_classification" %}

# The task's keys shrunk so that tests run in seconds: 16 px images and a narrow CNN.
DATA_OVERRIDES = ("data.image_size=16",)
MODEL_OVERRIDES = ("model.widths=[8,16]",)
SAMPLE_BROKEN = 2  # inputs of the small sample that preprocessing rejects
{%- else %}

# The task's keys shrunk so that tests run in seconds: 32 tokens, a small vocabulary, one block.
DATA_OVERRIDES = ("data.seq_len=32", "data.vocab_size=300")
# AdamW at a rate that learns within the few dozen steps of a test run.
MODEL_OVERRIDES = (
    "model.width=32",
    "model.depth=1",
    "model.heads=2",
    "model.mlp_width=64",
    "train.base_learning_rate=0.02",
)
SAMPLE_BROKEN = 4  # inputs of the small sample that preprocessing rejects
{%- endif %}


def pytest_collection_modifyitems(config, items):
    """With pytest-xdist (make test), the tests that share one training run stay on one worker, so
    that the run happens once."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if "finished_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("finished_run"))


@pytest.fixture(scope="session", autouse=True)
def eight_cpu_replicas():
    """Splits the CPU before any TensorFlow op runs in this process."""
    from {{ cookiecutter.package }} import distribute

    distribute.split_cpu(REPLICAS)


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory) -> Path:
    """The task's small sample raw data (a few hundred examples, with broken inputs)."""
    from {{ cookiecutter.package }} import tasks

    root = tmp_path_factory.mktemp("raw")
    tasks.current().write_sample_data(root, seed=1, small=True)
    return root


def run_preprocess(raw: Path | str, output: Path | str, *extra: str) -> dict:
    """Runs the real Beam pipeline in-process and returns the manifest."""
    import json

    from apache_beam.io.filesystems import FileSystems

    from {{ cookiecutter.package }} import preprocess

    assert preprocess.main(["--input", str(raw), "--output", str(output), "--runner=FnApiRunner", *extra]) == 0
    with FileSystems.open(f"{str(output).rstrip('/')}/manifest.json") as handle:
        return json.load(handle)


@pytest.fixture(scope="session")
def data_dir(raw_dir, tmp_path_factory) -> Path:
    """TFRecords of `raw_dir`, 4 shards per split, with DATA_OVERRIDES (fast to train on)."""
    output = tmp_path_factory.mktemp("tfrecords")
    run_preprocess(raw_dir, output, "--num_shards", "4", *DATA_OVERRIDES)
    return output


def tiny_config(data_dir: Path, output_dir: Path, *overrides: str):
    """configs/local.yaml shrunk to run in seconds: same code path, smaller everything."""
    from {{ cookiecutter.package }} import config

    return config.load(
        str(PROJECT / "configs" / "local.yaml"),
        [
            f"data.dir={data_dir}",
            *DATA_OVERRIDES,
            f"runtime.output_dir={output_dir}",
            *MODEL_OVERRIDES,
            "train.global_batch_size=32",
            "train.total_steps=24",
            "train.warmup_steps=4",
            "train.steps_per_execution=4",
            "train.checkpoint_every=8",
            "train.log_every=8",
            *overrides,
        ],
    )
