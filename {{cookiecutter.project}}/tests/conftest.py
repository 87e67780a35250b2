"""Shared fixtures: small real data (the task's generated sample -> real Beam pipeline -> TFRecords) and a
CPU split into 8 logical devices, so that tests run the TPU code path with 8 replicas."""

from __future__ import annotations

import os
import random
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

# What the project's task says about itself for tests (Task.testing): small data and model keys
# that run the same code path in seconds, and how many inputs of its small sample are rejected.
from {{ cookiecutter.package }} import tasks  # noqa: E402 (after sys.path; imports no TensorFlow)

TESTING = tasks.load(tasks.DEFAULT).testing()
DATA_OVERRIDES = tuple(item for item in TESTING.overrides if item.startswith("data."))
MODEL_OVERRIDES = tuple(item for item in TESTING.overrides if not item.startswith("data."))
SAMPLE_BROKEN = TESTING.rejected


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle",
        type=int,
        metavar="SEED",
        default=None,
        help="run the tests in an order shuffled with SEED (each test must pass after any other)",
    )


def pytest_collection_modifyitems(config, items):
    """--shuffle=SEED: the collected tests in a seeded random order (the same on every xdist worker).
    With pytest-xdist (make test), the tests that share one training run stay on one worker, so
    that the run happens once."""
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if {"finished_run", "contract_run", "lm_run"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("finished_run"))


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path, monkeypatch):
    """Each test its own cache folder (the stored `steps_per_execution: auto` choices), inherited by
    the commands it starts: no test reuses a measurement another test or the user made."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def global_state_restored():
    """Keras' global precision policy belongs to the process: training sets it (precision.apply).
    Each test finds it as the test before it found it, whichever tests ran first on its worker."""
    keras_module = sys.modules.get("tf_keras")  # not imported yet: the policy is Keras' default
    policy = keras_module.mixed_precision.global_policy().name if keras_module else "float32"
    yield
    keras_module = sys.modules.get("tf_keras")
    if keras_module:
        keras_module.mixed_precision.set_global_policy(policy)


@pytest.fixture
def seeded_weights():
    """Python's, NumPy's and TensorFlow's global seeds at 0 for the test, unseeded again after it. For a
    test whose verdict depends on the initial weights: parity's bound is measured from them (what
    summation order moves the loss by), and how close to it 8 replicas land varies with them (the
    gathered in-batch loss of tests/test_parity.py: 1.1x to 4.7x the larger reordering over seeds 0-5),
    so unseeded the same test could agree on one run and part on the next."""
    from {{ cookiecutter.package }}.core.keras import keras

    keras.utils.set_random_seed(0)
    yield
    import numpy as np
    import tensorflow as tf

    random.seed(None)
    np.random.seed(None)
    tf.random.set_seed(None)


@pytest.fixture(scope="session", autouse=True)
def eight_cpu_replicas():
    """Splits the CPU before any TensorFlow op runs in this process."""
    from {{ cookiecutter.package }}.core import distribute

    distribute.split_cpu(REPLICAS)


@pytest.fixture(scope="session")
def strategy():
    """The suite's 8-replica MirroredStrategy, the one training resolves in this process, for a
    task's own tests (an all_gather in a loss, a metric across replicas). Build no other: a second
    MirroredStrategy over the same devices in one process breaks the first one's collectives
    ("Shape mismatch in the collective instance")."""
    from {{ cookiecutter.package }}.core import config, distribute

    return distribute.resolve(config.load(None, ["runtime.strategy=auto"], registry=tasks).runtime).strategy


@pytest.fixture
def float32_policy():
    """The test's Keras models compute in float32 whatever global policy an earlier test left."""
    from {{ cookiecutter.package }}.core.keras import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy(previous)


def config_file(task_name: str, which: str = "local") -> Path:
    """A task's shipped config: configs/<which>.yaml for the project's own task, configs/<task>/
    for a task added later."""
    own = task_name == tasks.DEFAULT
    return PROJECT / "configs" / (f"{which}.yaml" if own else f"{task_name}/{which}.yaml")


_SAMPLES: dict = {}


def task_sample(task_name: str, tmp_path_factory) -> tuple[Path, Path]:
    """(raw folder, TFRecords folder) of a task's small sample (a few hundred examples with broken
    inputs), preprocessed by the real Beam pipeline into 4 shards per split with the task's test
    overrides; made once per session and task."""
    if task_name not in _SAMPLES:
        task = tasks.load(task_name)
        raw = tmp_path_factory.mktemp(f"raw-{task_name}")
        task.write_sample_data(raw, seed=1, small=True)
        output = tmp_path_factory.mktemp(f"tfrecords-{task_name}")
        data_overrides = [item for item in task.testing().overrides if item.startswith("data.")]
        run_preprocess(raw, output, "--config", str(config_file(task_name)), "--num_shards", "4", *data_overrides)
        _SAMPLES[task_name] = raw, output
    return _SAMPLES[task_name]


def module_task(request) -> str:
    """The task a test module is about: tests/test_task_<name>.py tests <name> (a project may hold
    more than one task); every other module tests the project's own."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    name = module.removeprefix("test_task_")
    return name if module.startswith("test_task_") and name in tasks.available() else tasks.DEFAULT


def task_of_data(data_dir) -> str:
    """The task whose sample `data_dir` holds (`task_sample`'s), else the project's own."""
    for name, (_, output) in _SAMPLES.items():
        if Path(output) == Path(data_dir):
            return name
    return tasks.DEFAULT


@pytest.fixture(scope="module")
def raw_dir(request, tmp_path_factory) -> Path:
    """The module's task's small sample raw data (a few hundred examples, with broken inputs)."""
    return task_sample(module_task(request), tmp_path_factory)[0]


def run_preprocess(raw: Path | str, output: Path | str, *extra: str) -> dict:
    """Runs the real Beam pipeline in-process and returns the manifest."""
    import json

    from apache_beam.io.filesystems import FileSystems

    from {{ cookiecutter.package }} import preprocess

    assert preprocess.main(["--input", str(raw), "--output", str(output), "--runner=FnApiRunner", *extra]) == 0
    with FileSystems.open(f"{str(output).rstrip('/')}/manifest.json") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def data_dir(request, raw_dir, tmp_path_factory) -> Path:
    """TFRecords of `raw_dir`, 4 shards per split, with the task's test overrides (fast to train on)."""
    return task_sample(module_task(request), tmp_path_factory)[1]


def task_config(task_name: str, data_dir: Path, output_dir: Path, *overrides: str):
    """The task's local config shrunk to run in seconds: same code path, smaller everything."""
    from {{ cookiecutter.package }}.core import config

    return config.load(
        str(config_file(task_name)),
        [
            f"data.dir={data_dir}",
            f"runtime.output_dir={output_dir}",
            *tasks.load(task_name).testing().overrides,
            "train.global_batch_size=32",
            "train.total_steps=24",
            "train.warmup_steps=4",
            "train.steps_per_execution=4",
            "train.checkpoint_every=8",
            "train.log_every=8",
            f"runtime.cpu_devices={REPLICAS}",  # the TPU's code path on 8 replicas (the shipped default is 2)
            *overrides,
        ],
        registry=tasks,
    )


_RUNS: dict = {}


def finished_run_of(task_name: str, tmp_path_factory):
    """(config, run folder, metrics, the untrained model's metrics) of one short real run of a task,
    shared by the tests that read it (each run traces the step for 8 replicas, the costly part): 48
    steps of steps_per_execution 4 in bfloat16 whatever the CPU supports (the TPU's code path), a
    profile window, an evaluation every 16 steps and a rotation of two checkpoints out of six saves."""
    if task_name not in _RUNS:
        from {{ cookiecutter.package }}.core import distribute, input_pipeline, precision, trainer
        from {{ cookiecutter.package }}.core.evaluation import evaluate_model
        from {{ cookiecutter.package }}.core.keras import keras
        from {{ cookiecutter.package }}.core.model import build_model, compile_model

        _, data = task_sample(task_name, tmp_path_factory)
        output = tmp_path_factory.mktemp(f"run-{task_name}")
        task = tasks.load(task_name)
        cfg = task_config(
            task_name,
            data,
            output,
            "runtime.mixed_precision=bfloat16",
            "runtime.profile_steps=8,16",
            "train.total_steps=48",
            "train.eval_every=16",
            "train.keep_checkpoints=2",
        )
        # The model training starts from (same seed): what the headline metric moves away from.
        resolved = distribute.resolve(cfg.runtime)
        manifest = input_pipeline.read_manifest(str(data), task, cfg.data)
        # Training sets Keras' global precision policy; the tests after it find the one they had,
        # whichever of them made the run.
        policy = keras.mixed_precision.global_policy()
        try:
            precision.set_policy("bfloat16")
            keras.utils.set_random_seed(cfg.runtime.seed)
            with resolved.strategy.scope():
                untrained = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, 1)
            initial = evaluate_model(untrained, resolved.strategy, cfg, task, manifest)
            metrics = trainer.train(cfg, task)
        finally:
            keras.mixed_precision.set_global_policy(policy)
        _RUNS[task_name] = cfg, output, metrics, initial
    return _RUNS[task_name]


def assert_same_updates(updates: list, expected: list, weights: list, terms: int) -> None:
    """Two float32 updates of a model's `weights` from the same global batch of `terms` examples
    agree: every value to 1e-4 of itself, and a value that cancels out to far less than the others (a
    sum of `terms` terms of either sign; a bias whose gradient is zero) to the float32 rounding of
    such a sum, `terms` units of float32 epsilon of the largest update, plus the last place of the
    largest weight, which `after - before` reads each side through. Eight replicas sum the same terms
    in another order than one device; a wrong scale or a missing replica's share is off by a tenth or
    more of every value."""
    import numpy as np

    largest_update = max(float(np.abs(value).max()) for value in expected)
    largest_weight = max(float(np.abs(value).max()) for value in weights)
    rounding = terms * np.finfo(np.float32).eps * largest_update + 2 * float(np.spacing(np.float32(largest_weight)))
    assert len(updates) == len(expected)
    for update, wanted in zip(updates, expected):
        np.testing.assert_allclose(update, wanted, rtol=1e-4, atol=rounding)


def tiny_config(data_dir: Path, output_dir: Path, *overrides: str):
    """The project's task's configs/local.yaml shrunk to run in seconds."""
    return task_config(tasks.DEFAULT, data_dir, output_dir, *overrides)
