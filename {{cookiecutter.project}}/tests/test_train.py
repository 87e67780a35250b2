"""Training on 8 CPU replicas, through the same code as on a TPU: the run directory, resume after
SIGTERM, NaN handling, steps_per_execution calibration, profiling and strategy resolution.

The 8-replica `model.fit` with steps_per_execution > 1 fed by `distribute_datasets_from_function`
is exactly the setup that fails under Keras 3 on TF 2.20 (see keras.py): these tests catch it.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import PROJECT, tiny_config
from {{ cookiecutter.package }} import capture_profile, config, distribute, steps_per_execution, train
from {{ cookiecutter.package }}.errors import UserError


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scalar_events(log_dir: Path) -> dict:
    """{tag: {step: value}} from the TensorBoard event files under `log_dir`."""
    events = {}
    for path in log_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                events.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return events


@pytest.fixture(scope="module")
def finished_run(data_dir, tmp_path_factory):
    """One short real run with a profile window, shared by the assertions below."""
    output = tmp_path_factory.mktemp("run")
    cfg = tiny_config(data_dir, output, "runtime.profile_steps=8,16", "train.total_steps=48")
    metrics = train.train(cfg)
    return cfg, output, metrics


def test_run_directory_is_complete(finished_run):
    cfg, output, metrics = finished_run
    written = json.loads((output / "metrics.json").read_text())
    assert written == pytest.approx(metrics)
    assert {"accuracy", "loss", "global_step", "examples_per_second"} <= set(written)
    assert written["global_step"] == 48
    assert written["examples_per_second"] > 0
    assert written["accuracy"] > 0.4  # 4 classes: chance is 0.25; the sample shapes are learnable
    resolved = config.load(str(output / "config.yaml"))
    assert resolved.train.steps_per_execution == 4 and resolved.train.total_steps == 48
    assert tf.train.latest_checkpoint(str(output / "checkpoints")).endswith("ckpt-48")


def test_rerunning_a_finished_run_only_evaluates(finished_run, capsys):
    cfg, output, metrics = finished_run
    again = train.train(config.load(str(output / "config.yaml"), ["train.steps_per_execution=auto"]))
    printed = capsys.readouterr().out
    assert "resumed from step 48" in printed and "calibrating" not in printed
    assert config.load(str(output / "config.yaml")).train.steps_per_execution == 4  # left as trained
    assert again["global_step"] == 48
    # Same weights; bfloat16 sums in another order may flip one borderline example at most.
    assert abs(again["accuracy"] - metrics["accuracy"]) <= 1.5 / again["eval_examples"]


def test_learning_rate_is_logged_every_step(finished_run):
    cfg, output, _ = finished_run
    events = scalar_events(output / "logs" / "train")
    assert sorted(events["learning_rate"]) == list(range(1, 49))
    peak = cfg.train.base_learning_rate * cfg.train.global_batch_size / cfg.train.base_batch_size
    assert events["learning_rate"][2] == pytest.approx(peak * 2 / cfg.train.warmup_steps, rel=1e-5)
    assert {"loss", "accuracy", "steps_per_second", "examples_per_second"} <= set(events)
    assert {"accuracy", "loss"} <= set(scalar_events(output / "logs" / "eval"))


def test_profile_window_leaves_a_trace(finished_run):
    _, output, _ = finished_run
    traces = list((output / "logs" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert traces and traces[0].stat().st_size > 0


def test_exported_model_serves_uint8_images(finished_run):
    _, output, _ = finished_run
    served = tf.saved_model.load(str(output / "export")).signatures["serving_default"]
    result = served(image=tf.zeros([2, 16, 16, 3], tf.uint8))
    assert result["probabilities"].shape == (2, 4)
    np.testing.assert_allclose(result["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)


def test_mixed_bfloat16_keeps_float32_variables_and_logits(data_dir, tmp_path):
    from {{ cookiecutter.package }}.model import build_model, set_precision

    set_precision("bfloat16")
    try:
        model = build_model(config.ModelConfig(widths=[8]), 16, 4)
        assert all(v.dtype == tf.float32 for v in model.trainable_variables)
        assert model.get_layer("stage0_block0_conv1").compute_dtype == "bfloat16"
        assert model(tf.zeros([1, 16, 16, 3], tf.uint8)).dtype == tf.float32
    finally:
        set_precision("float32")


def test_nan_loss_stops_without_saving(data_dir, tmp_path):
    cfg = tiny_config(data_dir, tmp_path, "train.base_learning_rate=1e30", "train.warmup_steps=0",
                      "train.checkpoint_every=1000")
    with pytest.raises(UserError, match="the loss became NaN at step \\d+; stopped without saving"):
        train.train(cfg)
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")) is None


def test_auto_steps_per_execution_is_measured(data_dir, tmp_path):
    cfg = tiny_config(data_dir, tmp_path, "train.steps_per_execution=auto", "train.log_every=16",
                      "train.checkpoint_every=16")
    resolved = distribute.resolve(cfg.runtime)
    from {{ cookiecutter.package }} import input_pipeline

    manifest = input_pipeline.read_manifest(str(data_dir))
    chosen, measurements = train.choose_steps_per_execution(cfg, resolved, manifest)
    assert [m.steps_per_execution for m in measurements] == steps_per_execution.candidates(16) == [1, 4, 16]
    assert all(m.steps_per_second > 0 for m in measurements)
    best = max(m.steps_per_second for m in measurements)
    assert isinstance(chosen, int)
    assert next(m for m in measurements if m.steps_per_execution == chosen).steps_per_second >= 0.95 * best


def test_calibration_picks_the_smallest_value_near_the_fastest():
    Measurement = steps_per_execution.Measurement
    measured = [Measurement(1, 10.0), Measurement(4, 40.0), Measurement(16, 41.0), Measurement(64, 42.0)]
    assert steps_per_execution.choose(measured).steps_per_execution == 4
    assert steps_per_execution.candidates(50) == [1, 4, 16, 50]


def test_strategy_resolution_on_this_machine():
    resolved = distribute.resolve(config.load(None, ["runtime.strategy=auto"]).runtime)
    assert (resolved.kind, resolved.replicas, resolved.hosts) == ("cpu", 8, 1)
    assert "8 replicas" in resolved.describe()
    with pytest.raises(UserError, match="runtime.strategy=tpu but no TPU could be initialised"):
        distribute.resolve(config.load(None, ["runtime.strategy=tpu"]).runtime)
    with pytest.raises(UserError, match="runtime.strategy=gpu but TensorFlow sees no GPU"):
        distribute.resolve(config.load(None, ["runtime.strategy=gpu"]).runtime)


def test_sigterm_saves_and_a_restart_resumes_to_the_exact_end(data_dir, tmp_path):
    """A preempted run (SIGTERM) checkpoints and exits; the same command then finishes the run.
    While it trains, a profile is captured on demand through its profiler port."""
    port = free_port()
    command = [sys.executable, "-m", "{{ cookiecutter.package }}.train", "--config", str(PROJECT / "configs/local.yaml"),
               f"data.dir={data_dir}", "data.image_size=16", f"runtime.output_dir={tmp_path}", "model.widths=[8,16]",
               "train.global_batch_size=32", "train.total_steps=200", "train.warmup_steps=4",
               "train.steps_per_execution=2", "train.checkpoint_every=1000", "train.log_every=10",
               f"runtime.profiler_port={port}"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output = []
    for line in process.stdout:  # wait until training is under way
        output.append(line)
        if line.startswith("step "):
            # On-demand profiling of the running job, as `make profile` does it.
            assert capture_profile.main(["--port", str(port), "--duration_ms", "500", "--logdir", str(tmp_path / "logs")]) == 0
            process.send_signal(signal.SIGTERM)
            break
    output += process.stdout.readlines()
    assert process.wait(timeout=120) == train.PREEMPTED_EXIT_STATUS, "".join(output)
    text = "".join(output)
    assert "preempted (SIGTERM) at step" in text and "Traceback" not in text
    saved = int(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).rsplit("-", 1)[1])
    assert 0 < saved < 200
    assert list((tmp_path / "logs" / "plugins" / "profile").glob("*/*.xplane.pb"))

    resumed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from step {saved}" in resumed.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 200


def test_data_and_run_directory_on_gcs(data_dir, gcs_bucket):
    """The Pod-slice layout: shards read from gs://, checkpoints, logs, metrics and export written to gs://."""
    data = gcs_bucket.path("train-test", "tfrecords")
    for path in data_dir.iterdir():
        tf.io.gfile.copy(str(path), f"{data}/{path.name}", overwrite=True)
    output = gcs_bucket.path("train-test", "run")
    cfg = tiny_config(data_dir, output, f"data.dir={data}", "train.total_steps=16")
    metrics = train.train(cfg)
    assert metrics["global_step"] == 16
    with tf.io.gfile.GFile(f"{output}/metrics.json") as handle:
        assert json.load(handle)["global_step"] == 16
    assert tf.train.latest_checkpoint(f"{output}/checkpoints").endswith("ckpt-16")
    assert tf.io.gfile.glob(f"{output}/logs/train/events.out.tfevents.*")
    assert tf.io.gfile.exists(f"{output}/export/saved_model.pb")
