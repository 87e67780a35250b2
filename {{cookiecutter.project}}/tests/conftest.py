"""Shared fixtures: small real data (generated images -> real Beam pipeline -> TFRecords) and a
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

REPLICAS = 8


@pytest.fixture(scope="session", autouse=True)
def eight_cpu_replicas():
    """Splits the CPU before any TensorFlow op runs in this process."""
    from {{ cookiecutter.package }} import distribute

    distribute.split_cpu(REPLICAS)


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory) -> Path:
    """A small sample image folder (4 classes x 60 images, mixed modes and sizes, two broken files)."""
    from {{ cookiecutter.package }}.sample_data import write_dataset

    root = tmp_path_factory.mktemp("raw")
    write_dataset(root, images_per_class=60, seed=1)
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
    """TFRecords of `raw_dir`, 4 shards per split, 16x16 images (fast to train on)."""
    output = tmp_path_factory.mktemp("tfrecords")
    run_preprocess(raw_dir, output, "--num_shards", "4", "--image_size", "16")
    return output


def tiny_config(data_dir: Path, output_dir: Path, *overrides: str):
    """configs/local.yaml shrunk to run in seconds: same code path, smaller everything."""
    from {{ cookiecutter.package }} import config

    return config.load(str(PROJECT / "configs" / "local.yaml"), [
        f"data.dir={data_dir}", "data.image_size=16", f"runtime.output_dir={output_dir}",
        "model.widths=[8,16]", "train.global_batch_size=32", "train.total_steps=24", "train.warmup_steps=4",
        "train.steps_per_execution=4", "train.checkpoint_every=8", "train.log_every=8", *overrides])
