"""Tests that only a TPU VM can run (`make test-tpu` there): the real TPUStrategy, on the chips of
the TPU type this project was generated for. Anywhere else they are skipped, with the reason."""

from __future__ import annotations

import json
import os

import pytest

from conftest import tiny_config
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core import config, distribute, topology

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(
        not distribute.on_tpu_vm(),
        reason="needs a TPU VM (no /dev/accel* or /dev/vfio/<n> here); run `make test-tpu` on the VM",
    ),
]


@pytest.fixture(scope="module")
def tpu_target():
    # Before TensorFlow touches a device: the CPU split of the other tests must not apply here.
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    return distribute.resolve(config.load(None, ["runtime.strategy=tpu"], registry=tasks).runtime)


def test_tpu_strategy_sees_the_chips_of_the_tpu_type(tpu_target):
    expected = topology.topology(os.environ.get("TPU_TYPE", topology.DEFAULT_TPU_TYPE))
    assert tpu_target.kind == "tpu"
    assert tpu_target.replicas == expected.replicas // expected.hosts * tpu_target.hosts
    assert type(tpu_target.strategy).__name__ == "TPUStrategy"


def test_a_short_training_run_on_the_tpu(tpu_target, data_dir, tmp_path):
    from {{ cookiecutter.package }}.core import trainer

    replicas = tpu_target.replicas
    cfg = tiny_config(
        data_dir,
        tmp_path,
        "runtime.strategy=tpu",
        f"train.global_batch_size={8 * replicas}",
        "train.total_steps=16",
        "train.steps_per_execution=4",
    )
    metrics = trainer.train(cfg, tasks.load(cfg.task))
    assert metrics["global_step"] == 16
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 16
