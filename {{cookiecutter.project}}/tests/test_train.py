"""Training on 8 CPU replicas, through the same code as on a TPU: the run directory, resume after
SIGTERM, NaN handling, steps_per_execution calibration, profiling and strategy resolution.

The 8-replica `model.fit` with steps_per_execution > 1 fed by `distribute_datasets_from_function`
is exactly the setup that fails under Keras 3 on TF 2.20 (see keras.py): these tests catch it.
"""

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import DATA_OVERRIDES, MODEL_OVERRIDES, PROJECT, finished_run_of, tiny_config
from {{ cookiecutter.package }} import capture_profile, tasks, train
from {{ cookiecutter.package }}.core import config, distribute, input_pipeline, profiler, run_dir, schedule
from {{ cookiecutter.package }}.core import steps_per_execution, trainer
from {{ cookiecutter.package }}.core.errors import UserError


@contextlib.contextmanager
def held_port(shared: bool):
    """A port that stays bound for the whole block, on every local address, so nothing else on the
    machine (another pytest worker, another test run) can bind it or be handed it meanwhile.
    shared=False: not listening, so a connection there is refused: "nothing listens there".
    shared=True: with SO_REUSEPORT, which gRPC also sets, so the profiler server a test starts can
    bind and listen there too (profiler.port_is_free counts such a port as free)."""
    import socket

    holder = socket.socket(socket.AF_INET6)
    holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # 0.0.0.0 too
    if shared:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    with holder:
        holder.bind(("::", 0))
        yield holder.getsockname()[1]


def scalar_events(log_dir: Path) -> dict:
    """{tag: {step: value}} from the TensorBoard event files under `log_dir`."""
    events = {}
    for path in log_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                events.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return events


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The project's task's shared short run (conftest.finished_run_of: 48 steps on 8 replicas with
    steps_per_execution 4 in bfloat16, a profile window, an evaluation every 16 steps, two of six
    checkpoints kept); tests/test_contract.py reads the same run."""
    cfg, output, metrics, _ = finished_run_of(tasks.DEFAULT, tmp_path_factory)
    return cfg, output, metrics


def test_run_directory_is_complete(finished_run):
    cfg, output, metrics = finished_run
    written = json.loads((output / "metrics.json").read_text())
    headline = tasks.load(tasks.DEFAULT).headline_metric
    # What the run wrote (tests/test_contract.py may have re-evaluated it since: the same figures).
    kept = (headline, "loss", "global_step", "eval_examples", "examples_per_second", "checkpoint_save_seconds")
    assert {key: written[key] for key in kept} == pytest.approx({key: metrics[key] for key in kept}, rel=1e-5)
    assert {headline, "loss", "global_step", "examples_per_second"} <= set(written)
    assert written["global_step"] == 48
    assert written["examples_per_second"] > 0 and written["loss"] > 0
    resolved = config.load(str(output / "config.yaml"), registry=tasks)
    assert resolved.train.steps_per_execution == 4 and resolved.train.total_steps == 48
    assert resolved.runtime.mixed_precision == "bfloat16" and written["mixed_precision"] == "bfloat16"
    assert tf.train.latest_checkpoint(str(output / "checkpoints")).endswith("ckpt-48")


def test_a_cpu_run_records_no_device_memory(finished_run):
    # On a GPU or TPU a run sets the devices' peak memory beside the plan (Trainer.measured_memory);
    # TensorFlow keeps no such count for a CPU, and this machine has no GPU.
    _, output, metrics = finished_run
    assert trainer.device_peak_bytes("cpu") is None and trainer.device_peak_bytes("gpu") is None
    written = json.loads((output / "metrics.json").read_text())
    assert not {"peak_memory_bytes", "planned_memory_bytes"} & (set(metrics) | set(written))
    assert trainer.describe_memory(metrics) == ""


def test_learning_rate_is_logged_every_step(finished_run):
    cfg, output, _ = finished_run
    events = scalar_events(output / "logs" / "train")
    assert sorted(events["learning_rate"]) == list(range(1, 49))
    peak = cfg.train.base_learning_rate * cfg.train.global_batch_size / cfg.train.base_batch_size
    assert events["learning_rate"][2] == pytest.approx(peak * 2 / cfg.train.warmup_steps, rel=1e-5)
    headline = tasks.load(tasks.DEFAULT).headline_metric
    assert {"loss", headline, "steps_per_second", "examples_per_second"} <= set(events)
    assert {headline, "loss"} <= set(scalar_events(output / "logs" / "eval"))


def test_profile_window_leaves_a_trace(finished_run):
    _, output, _ = finished_run
    traces = list((output / "logs" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert traces and traces[0].stat().st_size > 0


def test_mixed_bfloat16_keeps_float32_variables_logits_and_loss(data_dir, tmp_path):
    from {{ cookiecutter.package }}.core import precision
    from {{ cookiecutter.package }} import tasks
    from {{ cookiecutter.package }}.core.model import build_model, compile_model

    cfg = tiny_config(data_dir, tmp_path)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    precision.set_policy("bfloat16")
    try:
        task = tasks.load(cfg.task)
        model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, 1)
        assert all(v.dtype == tf.float32 for v in model.trainable_variables)
        assert any(layer.compute_dtype == "bfloat16" for layer in model.layers if layer.weights)
        inputs, labels = task.synthetic_batch(2, manifest)
        predictions = model(inputs)
        assert predictions.dtype == tf.float32
        assert model.compute_loss(inputs, labels, predictions).dtype == tf.float32
    finally:
        precision.set_policy("float32")


def test_auto_precision_says_what_it_chose_and_why(data_dir, tmp_path, capsys, monkeypatch):
    """On a CPU whose bfloat16 is emulated (an AVX2-only CI runner; here, on any CPU: TensorFlow's
    oneDNN kernels, its only native bfloat16 path, declared off), `auto` trains in float32, says why,
    and records float32 in the run. The variable is read by the precision choice only: TensorFlow
    read its own copy at import."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    cfg = tiny_config(data_dir, tmp_path, "train.total_steps=4", "train.warmup_steps=1")
    assert cfg.runtime.mixed_precision == "auto"  # the shipped local config
    metrics = trainer.train(cfg, tasks.load(cfg.task))
    printed = capsys.readouterr().out
    assert "precision float32 (auto: this CPU has" in printed and "bfloat16 would be emulated" in printed
    assert config.load(str(tmp_path / "config.yaml"), registry=tasks).runtime.mixed_precision == "float32"
    assert metrics["mixed_precision"] == "float32"


def test_auto_precision_trains_in_bfloat16_on_a_cpu_with_native_bfloat16(data_dir, tmp_path, capsys, monkeypatch):
    """The other branch, end to end on any CPU: one whose flags say native bfloat16 (a Sapphire Rapids
    here, simulated) trains in mixed_bfloat16, says so, records it, and its loss stays finite."""
    from {{ cookiecutter.package }}.core import precision
    from {{ cookiecutter.package }}.core.keras import keras

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda path=precision.CPUINFO: {"avx2", "avx512f", "avx512_bf16"})
    keras.mixed_precision.set_global_policy("float32")
    cfg = tiny_config(data_dir, tmp_path, "train.total_steps=4", "train.warmup_steps=1")
    assert cfg.runtime.mixed_precision == "auto"
    metrics = trainer.train(cfg, tasks.load(cfg.task))
    printed = capsys.readouterr().out
    assert "precision bfloat16 (auto: this CPU has native bfloat16 (avx512_bf16))" in printed, printed
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"  # what the model was built under
    assert config.load(str(tmp_path / "config.yaml"), registry=tasks).runtime.mixed_precision == "bfloat16"
    assert metrics["mixed_precision"] == "bfloat16" and np.isfinite(metrics["loss"]) and metrics["global_step"] == 4


def one_hot_metric(metric_class):
    """`metric_class` (a Keras metric of one-hot targets and probabilities, such as F1Score or AUC)
    on this project's integer targets and logits, for any task: both flattened to one row per target."""

    class OnIntegerTargets(metric_class):
        def update_state(self, y_true, y_pred, sample_weight=None):
            depth = y_pred.shape[-1]
            probabilities = tf.reshape(tf.nn.softmax(tf.cast(y_pred, tf.float32)), [-1, depth])
            targets = tf.one_hot(tf.reshape(tf.cast(y_true, tf.int32), [-1]), depth)
            if sample_weight is not None:
                weight = tf.cast(sample_weight, tf.float32)
                while weight.shape.rank < y_true.shape.rank:
                    weight = weight[..., None]
                sample_weight = tf.reshape(weight * tf.ones(tf.shape(y_true), tf.float32), [-1])
            return super().update_state(targets, probabilities, sample_weight)

    return OnIntegerTargets


def test_keras_f1_and_auc_report_under_bfloat16_on_8_replicas(data_dir, tmp_path, monkeypatch):
    """Keras' F1Score and AUC, which fail to read AutoCast state across replicas, report through a
    periodic evaluation and the final one under mixed_bfloat16 with 8 replicas and steps_per_execution
    2: the core makes every metric keep float32 state. A metric made with a bfloat16 policy anyway
    is refused in one line."""
    from {{ cookiecutter.package }}.core import precision
    from {{ cookiecutter.package }}.core.keras import keras
    from {{ cookiecutter.package }}.core.model import objective_metrics

    task = tasks.load(tasks.DEFAULT)
    own = task.build_metrics

    def build_metrics(objective_config, manifest):
        return [
            *own(objective_config, manifest),
            one_hot_metric(keras.metrics.F1Score)(average="macro", name="f1"),
            one_hot_metric(keras.metrics.AUC)(name="auc"),
        ]

    monkeypatch.setattr(task, "build_metrics", build_metrics)
    cfg = tiny_config(
        data_dir,
        tmp_path,
        "runtime.mixed_precision=bfloat16",
        "train.total_steps=8",
        "train.steps_per_execution=2",
        "train.log_every=4",
        "train.checkpoint_every=4",
        "train.eval_every=4",
    )
    result = trainer.train(cfg, tasks.load(cfg.task))
    assert result["mixed_precision"] == "bfloat16" and result["global_step"] == 8
    assert [entry["step"] for entry in result["history"]] == [4, 8]
    for entry in (*result["history"], result):
        assert 0 <= entry["f1"] <= 1 and 0 <= entry["auc"] <= 1, entry

    with precision.policy("mixed_bfloat16"):
        made_outside = keras.metrics.AUC(name="auc_bf16")
    monkeypatch.setattr(task, "build_metrics", lambda objective, manifest: [*own(objective, manifest), made_outside])
    with pytest.raises(
        UserError, match="the task's metric auc_bf16 uses the mixed_bfloat16 policy .*Task.build_metrics"
    ):
        objective_metrics(cfg, task, json.loads((data_dir / "manifest.json").read_text()))


def test_evaluation_uses_the_statistics_a_checkpoint_stores():
    """Batch norm's moving statistics are per replica while training; evaluation first gives every
    replica their mean, so that evaluating in the training process equals evaluating after a restore."""
    from {{ cookiecutter.package }}.core.evaluation import sync_replica_statistics
    from {{ cookiecutter.package }}.core.keras import keras

    strategy = distribute.resolve(config.load(None, ["runtime.strategy=auto"], registry=tasks).runtime).strategy
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(momentum=0.0)])

    @tf.function
    def train_step():
        def replica_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            model(tf.fill((2, 4), tf.cast(replica, tf.float32)), training=True)

        strategy.run(replica_fn)

    train_step()
    moving_mean = model.layers[0].moving_mean
    before = [float(t[0]) for t in strategy.experimental_local_results(moving_mean)]
    assert before == list(range(8))  # each replica's own batches
    sync_replica_statistics(model, strategy)
    after = [float(t[0]) for t in strategy.experimental_local_results(moving_mean)]
    assert after == [3.5] * 8 and float(moving_mean.numpy()[0]) == 3.5


@pytest.mark.slow
def test_nan_loss_stops_without_saving(data_dir, tmp_path):
    cfg = tiny_config(
        data_dir, tmp_path, "train.base_learning_rate=1e30", "train.warmup_steps=0", "train.checkpoint_every=1000"
    )
    with pytest.raises(UserError, match="the loss became NaN at step \\d+; stopped without saving"):
        trainer.train(cfg, tasks.load(cfg.task))
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")) is None
    # The run record says how the start ended: the next start resumes (from the last good checkpoint).
    assert json.loads((tmp_path / "metrics.json").read_text())["goodput"]["per_start"][-1]["end"] == "non-finite loss"


def test_early_stop_on_the_headline_metric_ends_the_run_and_a_rerun_trains_no_further(
    data_dir, tmp_path, capsys, monkeypatch
):
    """A learning rate too small to change the weights and a min_delta larger than any change: no
    evaluation improves on the first, so with train.early_stop_patience=2 training stops after the
    third (step 12 of 40). The run keeps its best
    checkpoint, evaluates, exports and records that it stopped early; the same command again
    evaluates it and trains no step."""
    task = tasks.load(tasks.DEFAULT)
    cfg = tiny_config(
        data_dir,
        tmp_path,
        "train.base_learning_rate=1e-9",
        "train.warmup_steps=0",
        "train.total_steps=40",
        "train.eval_every=4",
        "train.early_stop_patience=2",
        # Larger than any change of the headline: the first evaluation stays the best for early stopping
        # even where batch norm's statistics move without the weights.
        "train.early_stop_min_delta=1000",
    )
    from {{ cookiecutter.package }}.core.keras import keras

    seen = {}  # a callback of the task's own (Task.build_callbacks) sees each evaluation in Keras' logs
    recorder = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.update({batch: dict(logs)}))
    monkeypatch.setattr(task, "build_callbacks", lambda cfg, output_dir: [recorder])
    metrics = trainer.train(cfg, task)
    printed = capsys.readouterr().out
    evaluated = [logs for logs in seen.values() if f"eval_{task.headline_metric}" in logs]
    assert len(evaluated) == 3 and [entry[task.headline_metric] for entry in metrics["history"]] == [
        logs[f"eval_{task.headline_metric}"] for logs in evaluated
    ]
    assert metrics["global_step"] == 12 and [entry["step"] for entry in metrics["history"]] == [4, 8, 12]
    assert "stopping early at step 12" in printed and "did not improve" in metrics["stopped_early"]
    assert metrics["best_step"] in (4, 8, 12) and (tmp_path / "checkpoints" / "best").is_dir()
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-12")
    assert (tmp_path / "export" / "saved_model.pb").is_file()
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["goodput"]["per_start"][-1]["end"] == "stopped early"

    again = trainer.train(cfg, task)
    printed = capsys.readouterr().out
    assert "this run stopped early at step 12: evaluating it again, training no further" in printed
    assert again["global_step"] == 12 and "calibrating" not in printed
    start = json.loads((tmp_path / "metrics.json").read_text())["goodput"]["per_start"][-1]
    assert (start["initial_step"], start["furthest_step"], start["end"]) == (12, 12, "stopped early")


@pytest.mark.slow
def test_auto_steps_per_execution_is_measured(data_dir, tmp_path):
    cfg = tiny_config(
        data_dir, tmp_path, "train.steps_per_execution=auto", "train.log_every=16", "train.checkpoint_every=16"
    )
    resolved = distribute.resolve(cfg.runtime)
    from {{ cookiecutter.package }}.core import input_pipeline

    manifest = input_pipeline.read_manifest(str(data_dir), tasks.load(tasks.DEFAULT))
    chosen, measurements = steps_per_execution.choose_for(cfg, tasks.load(cfg.task), resolved, manifest)
    assert [m.steps_per_execution for m in measurements] == steps_per_execution.candidates(16) == [1, 4, 16]
    assert all(m.steps_per_second > 0 for m in measurements)
    # The value trained with is the one choose() makes of these measurements (choose's own rule is
    # tested with known rates in test_startup.py).
    assert chosen == steps_per_execution.choose(measurements).steps_per_execution


def test_calibration_picks_the_largest_value_near_the_fastest():
    Measurement = steps_per_execution.Measurement
    measured = [Measurement(1, 10.0), Measurement(4, 40.0), Measurement(16, 41.0), Measurement(64, 42.0)]
    assert steps_per_execution.choose(measured).steps_per_execution == 64
    measured[-1] = Measurement(64, 30.0)
    assert steps_per_execution.choose(measured).steps_per_execution == 16
    assert steps_per_execution.candidates(50) == [1, 4, 16, 50]


def test_strategy_resolution_on_this_machine(strategy):
    resolved = distribute.resolve(config.load(None, ["runtime.strategy=auto"], registry=tasks).runtime)
    assert (resolved.kind, resolved.replicas, resolved.hosts) == ("cpu", 8, 1)
    assert resolved.strategy is strategy  # the conftest fixture a task's own tests use: the same one
    assert "8 replicas" in resolved.describe()
    with pytest.raises(UserError, match="runtime.strategy=tpu but no TPU could be initialised"):
        distribute.resolve(config.load(None, ["runtime.strategy=tpu"], registry=tasks).runtime)
    with pytest.raises(UserError, match="runtime.strategy=gpu but TensorFlow sees no GPU"):
        distribute.resolve(config.load(None, ["runtime.strategy=gpu"], registry=tasks).runtime)


def train_command(data_dir: Path, output_dir: Path, *overrides: str) -> list[str]:
    """`python -m ...train` on the shrunk test model: long enough to be interrupted (steps_per_execution
    2, no periodic checkpoint), so that the checkpoint it leaves is the one the stop wrote."""
    return [
        sys.executable,
        "-m",
        "{{ cookiecutter.package }}.train",
        "--config",
        str(PROJECT / "configs/local.yaml"),
        f"data.dir={data_dir}",
        *DATA_OVERRIDES,
        f"runtime.output_dir={output_dir}",
        *MODEL_OVERRIDES,
        "train.global_batch_size=32",
        "train.warmup_steps=4",
        "train.steps_per_execution=2",
        "train.checkpoint_every=1000",
        "train.log_every=10",
        "runtime.cpu_devices=8",  # the TPU path's 8 replicas (the shipped local run has 2)
        *overrides,
    ]


@pytest.mark.slow
def test_sigterm_saves_and_a_restart_resumes_to_the_exact_end(data_dir, tmp_path):
    """A preempted run (SIGTERM) checkpoints and exits; the same command then finishes the run.
    While it trains, a profile is captured on demand through its profiler port. 1000 steps: after
    the capture, far more than any machine runs before the signal lands."""
    with held_port(shared=True) as port:  # held through both starts, whose profiler servers bind it
        command = train_command(data_dir, tmp_path, "train.total_steps=1000", f"runtime.profiler_port={port}")
        env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        output = []
        for line in process.stdout:  # wait until training is under way
            output.append(line)
            if line.startswith("step "):
                # On-demand profiling of the running job, as `make profile` does it.
                assert (
                    capture_profile.main(
                        ["--port", str(port), "--duration_ms", "500", "--logdir", str(tmp_path / "logs")]
                    )
                    == 0
                )
                process.send_signal(signal.SIGTERM)
                break
        output += process.stdout.readlines()
        assert process.wait(timeout=120) == train.PREEMPTED_EXIT_STATUS, "".join(output)
        text = "".join(output)
        assert "preempted (SIGTERM) at step" in text and "Traceback" not in text
        saved = int(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).rsplit("-", 1)[1])
        assert 0 < saved < 1000
        assert list((tmp_path / "logs" / "plugins" / "profile").glob("*/*.xplane.pb"))

        resumed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"resumed from step {saved}" in resumed.stdout
        assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 1000


def fed_targets(cfg, start_step: int, batches: int) -> list:
    """The targets of `batches` global batches `train` feeds from `start_step` of the run's order, in
    order, replica by replica."""
    from {{ cookiecutter.package }}.core import input_pipeline

    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(cfg.data.dir, tasks.load(cfg.task), cfg.data)
    dataset = input_pipeline.training_dataset(
        cfg, tasks.load(cfg.task), resolved, manifest, seed=cfg.runtime.seed, start_step=start_step
    )
    iterator, seen = iter(dataset), []
    for _ in range(batches):
        _, targets = next(iterator)
        seen.append([tensor.numpy().tolist() for tensor in resolved.strategy.experimental_local_results(targets)])
    return seen


def test_a_resumed_input_feeds_what_the_uninterrupted_run_would(data_dir, tmp_path):
    """The 8-replica train input rebuilt at step 6 feeds each replica the batches that the input started
    at step 0 feeds it at steps 6-9 (across the end of the first epoch: 12 steps of 32 cover the
    split's ~380 train examples)."""
    cfg = tiny_config(data_dir, tmp_path / "run")
    uninterrupted = fed_targets(cfg, 0, 14)
    assert fed_targets(cfg, 6, 4) == uninterrupted[6:10]
    assert fed_targets(cfg, 11, 3) == uninterrupted[11:14]
    assert uninterrupted[0] != uninterrupted[12]  # the second epoch is another order


@pytest.mark.slow
def test_data_and_run_directory_on_gcs(data_dir, gcs_bucket):
    """The Pod-slice layout: shards read from gs://, checkpoints, logs, metrics and export written to gs://."""
    data = gcs_bucket.path("train-test", "tfrecords")
    for path in data_dir.iterdir():
        tf.io.gfile.copy(str(path), f"{data}/{path.name}", overwrite=True)
    output = gcs_bucket.path("train-test", "run")
    cfg = tiny_config(data_dir, output, f"data.dir={data}", "train.total_steps=16")
    metrics = trainer.train(cfg, tasks.load(cfg.task))
    assert metrics["global_step"] == 16
    with tf.io.gfile.GFile(f"{output}/metrics.json") as handle:
        assert json.load(handle)["global_step"] == 16
    assert tf.train.latest_checkpoint(f"{output}/checkpoints").endswith("ckpt-16")
    assert tf.io.gfile.glob(f"{output}/logs/train/events.out.tfevents.*")
    assert tf.io.gfile.exists(f"{output}/export/saved_model.pb")


def test_periodic_evaluation_logs_each_step_and_keeps_the_best(finished_run):
    _, output, metrics = finished_run
    headline = tasks.load(tasks.DEFAULT).headline_metric
    assert [entry["step"] for entry in metrics["history"]] == [16, 32, 48]
    best = next(entry for entry in metrics["history"] if entry["step"] == metrics["best_step"])
    assert metrics[f"best_{headline}"] == best[headline]  # which one is best: tests/test_contract.py
    assert metrics["history"][-1][headline] == metrics[headline]
    assert sorted(scalar_events(output / "logs" / "eval")[headline]) == [16, 32, 48]
    # The best checkpoint is kept apart from the rotation (keep_checkpoints=2 keeps ckpt-40 and ckpt-48).
    rotation = tf.train.get_checkpoint_state(str(output / "checkpoints")).all_model_checkpoint_paths
    assert [Path(path).name for path in rotation] == ["ckpt-40", "ckpt-48"]
    assert tf.train.latest_checkpoint(str(output / "checkpoints" / "best")).endswith(f"ckpt-{best['step']}")
    assert json.loads((output / "metrics.json").read_text())["best_step"] == best["step"]
    assert set(metrics["phase_seconds"]) >= {"start-up", "training", "evaluation", "export"}


def copy_with_a_truncated_latest_checkpoint(output: Path, run: Path) -> None:
    """A copy of the finished run (checkpoints every 8 steps, keeps ckpt-40 and ckpt-48) whose
    newest save was cut short."""
    shutil.copytree(output, run)
    for data_file in run.glob("checkpoints/ckpt-48.data-*"):
        data_file.write_bytes(data_file.read_bytes()[:100])


def test_a_truncated_latest_checkpoint_falls_back_to_the_one_before(finished_run, tmp_path, capsys):
    """What `train` does first on a restart, without the training (see the slow test below)."""
    from {{ cookiecutter.package }}.core import input_pipeline
    from {{ cookiecutter.package }}.core.model import build_model, compile_model

    cfg, output, _ = finished_run
    copy_with_a_truncated_latest_checkpoint(output, tmp_path / "run")
    task = tasks.load(cfg.task)
    manifest = input_pipeline.read_manifest(cfg.data.dir, task)
    strategy = distribute.resolve(cfg.runtime).strategy
    with strategy.scope():
        model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, 1)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / "run" / "checkpoints"), max_to_keep=2)
    capsys.readouterr()
    restored = run_dir.restore_newest_readable(checkpoint, manager)
    assert restored.endswith("ckpt-40") and int(model.optimizer.iterations.numpy()) == 40
    assert "ckpt-48 cannot be read" in capsys.readouterr().out
    # The learning rate continues where the run stopped: the schedule the optimizer holds, at its
    # restored step, gives the formula's value for step 40 of this run (not the warm-up's start).
    from {{ cookiecutter.package }}.core.keras import keras

    held = keras.optimizers.schedules.deserialize(model.optimizer.get_config()["learning_rate"])
    peak = cfg.train.base_learning_rate * cfg.effective_batch_size / cfg.train.base_batch_size
    expected = schedule.learning_rate_at(40, peak, cfg.train.warmup_steps, cfg.train.total_steps)
    assert float(held(model.optimizer.iterations)) == pytest.approx(expected, rel=1e-5)
    assert expected > 0


def test_make_eval_evaluates_the_checkpoint_before_a_truncated_latest_one(finished_run, tmp_path, capsys):
    """`make eval` restores as `make train` does: the newest save cut short, it evaluates the one
    before and says so in one line."""
    from {{ cookiecutter.package }} import evaluate

    cfg, output, _ = finished_run
    run = tmp_path / "run"
    copy_with_a_truncated_latest_checkpoint(output, run)
    capsys.readouterr()
    assert evaluate.main(["--config", str(run / "config.yaml"), f"runtime.output_dir={run}"]) == 0
    printed = capsys.readouterr().out
    assert "ckpt-48 cannot be read" in printed and "trying the one before" in printed
    assert f"evaluating {run / 'checkpoints' / 'ckpt-40'} (step 40)" in printed
    assert json.loads((run / "metrics.json").read_text())["global_step"] == 40


def test_a_finished_run_whose_newest_checkpoint_is_cut_short_trains_on_to_its_end(finished_run, tmp_path, capsys):
    """The record says the run finished at step 48, but ckpt-48 cannot be read: the start restores
    ckpt-40 and trains the 8 steps again instead of evaluating the older weights as the finished run."""
    _, output, _ = finished_run
    run = tmp_path / "run"
    copy_with_a_truncated_latest_checkpoint(output, run)
    capsys.readouterr()
    cfg = config.load(str(run / "config.yaml"), [f"runtime.output_dir={run}"], registry=tasks)
    metrics = trainer.train(cfg, tasks.load(cfg.task))
    printed = capsys.readouterr().out
    assert "the run finished at step 48, restored at 40: training on" in printed
    assert metrics["global_step"] == 48
    start = json.loads((run / "metrics.json").read_text())["goodput"]["per_start"][-1]
    assert (start["initial_step"], start["furthest_step"], start["end"]) == (40, 48, "finished")


@pytest.mark.slow
def test_a_restart_after_a_truncated_save_resumes_from_the_one_before(finished_run, tmp_path, capsys, monkeypatch):
    _, output, _ = finished_run
    run = tmp_path / "run"
    copy_with_a_truncated_latest_checkpoint(output, run)
    capsys.readouterr()
    starts = []
    feeds = input_pipeline.training_dataset
    monkeypatch.setattr(
        input_pipeline,
        "training_dataset",
        lambda *args, seed, start_step=0, **order: (
            starts.append((seed, start_step)) or feeds(*args, seed=seed, start_step=start_step, **order)
        ),
    )
    cfg = config.load(str(run / "config.yaml"), [f"runtime.output_dir={run}", "train.total_steps=56"], registry=tasks)
    metrics = trainer.train(cfg, tasks.load(cfg.task))
    printed = capsys.readouterr().out
    assert "ckpt-48 cannot be read" in printed and "resumed from step 40" in printed
    assert metrics["global_step"] == 56
    # The resumed input continues the run's order at the restored checkpoint's step.
    assert starts == [(cfg.runtime.seed, 40)]


def test_the_calibration_never_exceeds_the_time_bound(data_dir, tmp_path, capsys):
    cfg = tiny_config(
        data_dir,
        tmp_path,
        "train.steps_per_execution=auto",
        "train.log_every=16",
        "train.checkpoint_every=16",
        "train.max_seconds_per_execution=0.001",
    )
    resolved = distribute.resolve(cfg.runtime)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    chosen, measurements = steps_per_execution.choose_for(cfg, tasks.load(cfg.task), resolved, manifest)
    assert chosen == 1 and [m.steps_per_execution for m in measurements] == [1]
    assert "not tried: 4, 16" in capsys.readouterr().out


class FakeMetadataServer:
    """The GCE metadata server's preemption keys on loopback; `preempted` flips the answer."""

    def __init__(self):
        import http.server
        import threading

        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Metadata-Flavor")))
                answers = {
                    "/computeMetadata/v1/instance/preempted": "TRUE" if server.preempted else "FALSE",
                    "/computeMetadata/v1/instance/maintenance-event": "NONE",
                }
                body = answers.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write((body or "").encode())

            def log_message(self, *args):
                pass

        self.preempted, self.requests = False, []
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_metadata_watcher_reads_the_notice_and_switches_off_without_a_server():
    from {{ cookiecutter.package }}.core import preemption

    server = FakeMetadataServer()
    try:
        notices = []
        watcher = preemption.MetadataWatcher(notices.append, interval=0.05, host=server.host)
        assert watcher.poll() is None
        server.preempted = True
        watcher.start()
        watcher.join(timeout=10)
        assert notices == ["the metadata server reports instance/preempted=TRUE"]
        assert all(flavor == "Google" for _, flavor in server.requests)
    finally:
        server.close()
    closed = preemption.MetadataWatcher(notices.append, host="127.0.0.1:9")
    assert closed.poll() is None and not closed.active  # nothing listens: it stops asking


@pytest.mark.slow
def test_a_preemption_notice_stops_the_run_and_it_resumes_to_the_exact_end(data_dir, tmp_path):
    """Cloud TPU's way: the metadata server says instance/preempted=TRUE; training saves and exits
    with 143 like on SIGTERM, and the same command then finishes exactly at total_steps, here on
    another slice size (2 replicas instead of 8, the same global batch: the input's order goes on).
    The watcher polls every 0.1 s and 1000 steps remain when the notice is set: the run cannot
    finish first."""
    server = FakeMetadataServer()
    command = train_command(data_dir, tmp_path, "train.total_steps=1000", "runtime.metadata_poll_seconds=0.1")
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYTHONUNBUFFERED": "1", "GCE_METADATA_HOST": server.host}
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        output = []
        for line in process.stdout:
            output.append(line)
            if line.startswith("step "):
                server.preempted = True
                break
        output += process.stdout.readlines()
        assert process.wait(timeout=120) == train.PREEMPTED_EXIT_STATUS, "".join(output)
    finally:
        server.close()
    text = "".join(output)
    assert "preempted (the metadata server reports instance/preempted=TRUE) at step" in text
    assert "Traceback" not in text and "timings: " in text
    saved = int(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).rsplit("-", 1)[1])
    assert 0 < saved < 1000

    env["GCE_METADATA_HOST"] = "127.0.0.1:9"
    resumed = subprocess.run([*command, "runtime.cpu_devices=2"], capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from step {saved}" in resumed.stdout
    assert (
        f"resumed on 1 host x 2 replicas from a 1 x 8 layout at step {saved}: the same records per step from each "
        "pipeline, the order goes on"
    ) in resumed.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 1000


def test_gradient_accumulation_gives_the_update_of_the_whole_batch():
    """k=4 micro-batches of 64 make the same first update as one batch of 256 (float32, no batch norm),
    on the 8 CPU replicas."""
    from {{ cookiecutter.package }}.core.keras import keras
    from {{ cookiecutter.package }}.core import precision
    from {{ cookiecutter.package }}.core.model import TaskModel

    precision.set_policy("float32")
    strategy = distribute.resolve(config.load(None, ["runtime.strategy=cpu"], registry=tasks).runtime).strategy
    rng = np.random.default_rng(0)
    features = rng.normal(size=(256, 6)).astype("float32")
    labels = rng.integers(0, 3, size=256).astype("int32")

    def network(kind):
        keras.utils.set_random_seed(1)
        inputs = keras.Input((6,))
        outputs = keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(inputs))
        return kind(inputs, outputs)

    def first_update(kind, dataset, accumulation_steps=1):
        with strategy.scope():
            model = network(kind)
            model.accumulation_steps = accumulation_steps
            model.compile(keras.optimizers.SGD(0.5), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        before = [v.numpy() for v in model.trainable_variables]
        model.fit(dataset, epochs=1, steps_per_epoch=1, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 1  # one update, however many micro-batches
        return [after.numpy() - start for after, start in zip(model.trainable_variables, before)]

    replicas = strategy.num_replicas_in_sync

    def per_replica(shape):
        """Replica r's share of each batch, as distribute_datasets_from_function hands it out."""

        def dataset_fn(context):
            x = features.reshape(*shape, 6)
            y = labels.reshape(*shape)
            slices = [(x[..., r::replicas, :], y[..., r::replicas]) for r in range(replicas)]
            return tf.data.Dataset.from_tensor_slices(tuple(np.stack(part) for part in zip(*slices)))

        return strategy.distribute_datasets_from_function(dataset_fn)

    expected = first_update(keras.Model, per_replica((256,)))
    accumulated = first_update(TaskModel, per_replica((4, 64)), accumulation_steps=4)
    for got, want in zip(accumulated, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_training_with_accumulation_counts_optimizer_updates(data_dir, tmp_path, capsys):
    cfg = tiny_config(data_dir, tmp_path, "train.gradient_accumulation_steps=2", "train.total_steps=8")
    metrics = trainer.train(cfg, tasks.load(cfg.task))
    printed = capsys.readouterr().out
    assert "effective batch 64 (= 32 x 2 accumulated)" in printed
    assert metrics["global_step"] == 8  # optimizer updates, each of 2 x 32 examples
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-8")


def test_profile_with_no_job_listening_is_one_line():
    with (
        held_port(shared=False) as port,
        pytest.raises(  # nothing listens there
            UserError, match=f"no profiler server answered on localhost:{port}.*runtime.profiler_port={port}"
        ),
    ):
        capture_profile.main(["--port", str(port), "--duration_ms", "100", "--logdir", "/tmp/unused-logs"])


def test_a_profiler_port_in_use_is_one_warning_and_no_server(capsys):
    """Another job's server on the port (TensorFlow would only log "Unable to bind", and a second
    gRPC server could share the port with the first): one warning naming the key, no server started.
    A port held but not listened on with port reuse (as tests hold one for the profiler) is free."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert profiler.start_server(port) is False
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith(f"warning: profiler port {port} is in use"), printed
    assert "runtime.profiler_port" in printed[0]
    with socket.socket(socket.AF_INET6) as holder:
        holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("::", 0))
        assert profiler.port_is_free(holder.getsockname()[1])
    with socket.socket() as plain:  # bound without port reuse: gRPC could not bind it
        plain.bind(("0.0.0.0", 0))
        assert not profiler.port_is_free(plain.getsockname()[1])


def with_random_draws() -> list[str]:
    """Overrides that switch on the random draws the project's task has beside the input order: its
    augmentation (random crops and flips, drawn in the input pipeline) and its dropout (masks drawn in
    the training step), which a resumed start must draw as the uninterrupted run drew them."""
    task = tasks.load(tasks.DEFAULT)
    data_keys = {field.name for field in dataclasses.fields(task.data_config)}
    model_keys = {field.name for field in dataclasses.fields(task.model_config)}
    return [
        *(["data.augment=true"] if "augment" in data_keys else []),
        *(["model.dropout=0.1"] if "dropout" in model_keys else []),
    ]


def test_the_random_generators_leave_the_initial_weights_as_the_task_builds_them(strategy, float32_policy):
    """build_model gives every random layer a checkpointed generator without moving an initializer's
    seed: under the same global seed its initial weights are bit for bit those of the task's own
    network, with dropout between the layers (making the generators while the network was built took
    a seed from the initializers' sequence at each random layer: every later weight was drawn from
    another seed, and a recipe tuned on the old draws learned less on real data)."""
    import types

    from {{ cookiecutter.package }}.core import config, model as model_lib
    from {{ cookiecutter.package }}.core.keras import keras

    def network(model_config, manifest):
        inputs = keras.Input((16,))
        x = keras.layers.Dense(32, name="first")(inputs)
        x = keras.layers.Dropout(0.0, name="drop")(x)  # rate 0: it still builds a random layer
        x = keras.layers.Dense(32, name="second")(keras.layers.GaussianNoise(0.1, name="noise")(x))
        return keras.Model(inputs, keras.layers.Dense(4, name="third")(keras.layers.Dropout(0.1, name="drop2")(x)))

    task = types.SimpleNamespace(build_model=network, build_step_loss=lambda objective_config, manifest: None)
    cfg = config.load(None, [], registry=tasks)
    with strategy.scope():
        keras.utils.set_random_seed(3)
        bare = network(cfg.model, {})
        keras.utils.set_random_seed(3)
        built = model_lib.build_model(cfg, task, {})
    assert len(built.random_generators) == 3  # the two Dropout layers and the noise: all checkpointed
    assert [weight.name for weight in built.weights] == [weight.name for weight in bare.weights]
    for ours, theirs in zip(built.get_weights(), bare.get_weights()):
        np.testing.assert_array_equal(ours, theirs)


def test_dropout_masks_resume_from_the_checkpoint(strategy, tmp_path, float32_policy):
    """The layers that draw random numbers in training (Keras' Dropout and GaussianNoise, a recomputed
    block's Dropout) draw them from generators that build_model puts in the model's checkpoint, not
    among its weights: a model restored from it draws what the saved one drew next, and each of the 8
    replicas draws its own."""
    import types

    from {{ cookiecutter.package }}.core import model as model_lib
    from {{ cookiecutter.package }}.core import recompute
    from {{ cookiecutter.package }}.core.keras import keras

    def network(model_config, manifest):
        inputs = keras.Input((64,))
        x = keras.layers.GaussianNoise(1.0, name="noise")(keras.layers.Dropout(0.5, name="drop")(inputs))
        block_input = keras.Input((64,))
        block = keras.Model(block_input, recompute.Dropout(0.5, name="block_drop")(block_input), name="block")
        return keras.Model(inputs, recompute.Recomputed(block, name="recomputed")(x))

    task = types.SimpleNamespace(build_model=network, build_step_loss=lambda objective_config, manifest: None)
    cfg = config.load(None, [], registry=tasks)

    def built(seed: int):
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            return model_lib.build_model(cfg, task, {})

    def draw(model) -> np.ndarray:
        """Each replica's outputs of the same input in training: [replicas, 64]."""
        outputs = tf.function(lambda: strategy.run(lambda: model(tf.ones([1, 64]), training=True)))()
        return np.concatenate([value.numpy() for value in strategy.experimental_local_results(outputs)])

    model = built(1)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/random_generators/")]
    assert len(saved) == 4 and not model.weights  # each random layer's (the recomputed Dropout's too); no weight
    first, second = draw(model), draw(model)
    assert len({row.tobytes() for row in first}) == 8  # every replica its own masks and noise
    assert not np.array_equal(first, second)  # and new ones at every step

    restored = built(2)  # another seed: it draws otherwise until it is restored
    assert not np.array_equal(draw(restored), first)
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(draw(restored), first)
    np.testing.assert_array_equal(draw(restored), second)


def checkpoint_values(path: str) -> dict:
    reader = tf.train.load_checkpoint(path)
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith(("input/", "save_counter"))  # the cursor's JSON, the save count
    }


@pytest.mark.slow
@pytest.mark.parametrize("fine_tune", [False, True], ids=["from-scratch", "from-another-run"])
def test_a_run_killed_and_preempted_ends_bitwise_equal_to_an_uninterrupted_one(data_dir, tmp_path, fine_tune):
    """runtime.deterministic on 8 replicas in float32, with the task's augmentation and dropout on: one
    start SIGKILLed after step 15 (resumed from its checkpoint at 10: the steps after it are repeated),
    the next SIGTERMed after step 25 (it saves at the next execution boundary, between checkpoints), the
    third finishes; its final weights and optimizer state (and the state of the dropout layers' random
    generators) equal an uninterrupted run's, bit for bit (batch norm's moving statistics, where the
    model has them, to float rounding: see below), and the goodput record counts the repeated steps.
    `from-another-run`: both start from a short run's weights (train.init_from), read once by each."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYTHONUNBUFFERED": "1"}
    source = []
    if fine_tune:
        made = subprocess.run(
            train_command(data_dir, tmp_path / "source", "train.total_steps=6"),
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        source = [f"train.init_from={tmp_path / 'source'}"]
    overrides = [
        *source,
        "runtime.deterministic=true",
        "runtime.mixed_precision=float32",
        "train.total_steps=40",
        "train.checkpoint_every=10",
        "train.steps_per_execution=2",
        "train.log_every=1",
        "train.eval_every=0",
        *with_random_draws(),
    ]
    straight = subprocess.run(
        train_command(data_dir, tmp_path / "straight", *overrides), capture_output=True, text=True, env=env, timeout=600
    )
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]

    command = train_command(data_dir, tmp_path / "stopped", *overrides)
    for stop, past in ((signal.SIGKILL, 15), (signal.SIGTERM, 25)):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        output = []
        for line in process.stdout:
            output.append(line)
            if line.startswith("step ") and int(line.split()[1].split("/")[0]) > past:
                process.send_signal(stop)
                break
        output += process.stdout.readlines()
        process.wait(timeout=120)
        assert process.returncode == (-signal.SIGKILL if stop == signal.SIGKILL else train.PREEMPTED_EXIT_STATUS), (
            "".join(output)
        )
    finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert "resumed from step " in finished.stdout and "the input at its step" in finished.stdout
    if fine_tune:
        assert "initialised from " in straight.stdout and "train.init_from not read" in finished.stdout

    want = checkpoint_values(str(tmp_path / "straight/checkpoints/ckpt-40"))
    got = checkpoint_values(str(tmp_path / "stopped/checkpoints/ckpt-40"))
    assert got.keys() == want.keys() and len(want) > 4
    # Batch norm's moving statistics are kept per replica and saved as their mean: a resume starts every
    # replica from that mean, so they differ from the uninterrupted run's in the last digits (they serve
    # evaluation only; the training step normalises by the batch's own statistics).
    statistics = [name for name in want if "/moving_mean/" in name or "/moving_variance/" in name]
    different = [name for name in want if name not in statistics and not np.array_equal(got[name], want[name])]
    assert not different, different[:5]
    for name in statistics:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)  # 3.6e-7 measured
    record = json.loads((tmp_path / "stopped/metrics.json").read_text())["goodput"]
    assert record["starts"] == 3 and record["repeated_steps"] > 0
