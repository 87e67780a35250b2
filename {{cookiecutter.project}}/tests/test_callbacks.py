"""Each between-execution concern of the trainer (callbacks.py), alone, on a tiny Keras model that
`fit` trains for a few steps in a fraction of a second: what it does at which step."""

from __future__ import annotations

import math
import os
import re
import signal
import threading

import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_config
from {{ cookiecutter.package }}.core import callbacks, goodput, input_pipeline, utilisation
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core.keras import keras
from {{ cookiecutter.package }}.core.model import metric_names
from {{ cookiecutter.package }}.core.topology import Target


@pytest.fixture
def float32_policy():
    """The tiny model computes in float32 whatever policy an earlier test left."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy(previous)


def fit(callback_list, steps: int, steps_per_execution: int, labels=None):
    """Trains a one-layer regression for `steps` steps of batch 4; returns the model."""
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=steps_per_execution)
    features = np.random.default_rng(0).normal(size=(4 * steps, 3)).astype("float32")
    targets = features.sum(axis=1, keepdims=True) if labels is None else labels
    dataset = tf.data.Dataset.from_tensor_slices((features, targets)).batch(4).repeat()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, callbacks=callback_list, verbose=0)
    return model


class Steps(callbacks.BetweenExecutions):
    """Records (previous, step) of every execution: what the other callbacks see."""

    def __init__(self):
        super().__init__(0)
        self.seen = []

    def on_execution_end(self, step, previous, logs):
        self.seen.append((previous, step))


def test_crossed_counts_boundaries_an_execution_steps_over():
    assert callbacks.crossed(4, 3, 6) and callbacks.crossed(4, 0, 4) and not callbacks.crossed(4, 4, 7)
    assert not callbacks.crossed(0, 0, 100)  # 0: never (e.g. train.eval_every=0)


def test_each_execution_reports_the_optimizer_step_reached(float32_policy):
    steps = Steps()
    fit([steps], steps=9, steps_per_execution=3)
    assert steps.seen == [(0, 3), (3, 6), (6, 9)]


def test_first_execution_ends_the_clocks_first_phase_once(float32_policy, capsys):
    clock = goodput.PhaseClock()
    clock.start(goodput.FIRST_EXECUTION)
    first = callbacks.FirstExecution(0, clock)
    fit([first], steps=6, steps_per_execution=2)
    assert clock.current == goodput.TRAINING and goodput.FIRST_EXECUTION in clock.seconds
    assert (first.first_step, first.step) == (2, 6)
    printed = capsys.readouterr().out
    assert printed.count("time to first step") == 1
    rate = first.examples_per_second(4)
    assert math.isfinite(rate) and rate > 0
    assert math.isnan(callbacks.FirstExecution(0, clock).examples_per_second(4))  # nothing timed


def test_nan_guard_stops_before_anything_is_saved(float32_policy, tmp_path):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=2)
    checkpoints = callbacks.Checkpoints(0, manager, checkpoint_every=2)
    labels = np.full((4 * 8, 1), np.nan, "float32")
    with pytest.raises(
        callbacks.NonFiniteLoss,
        match=r"the loss became NaN at step 2; stopped without saving "
        r"\(last good checkpoint: none\); lower train.base_learning_rate",
    ):
        fit([callbacks.NanGuard(0, manager), checkpoints], steps=8, steps_per_execution=2, labels=labels)
    assert manager.checkpoints == []


def test_step_log_prints_at_log_boundaries_and_logs_every_steps_rate(float32_policy, data_dir, tmp_path, capsys):
    from test_train import scalar_events

    cfg = tiny_config(data_dir, tmp_path, "train.total_steps=9", "train.log_every=4", "train.warmup_steps=3")
    writer = tf.summary.create_file_writer(str(tmp_path / "logs"))
    # A step of 1 TFLOP on a host whose stored peak is 4 TFLOP/s: TFLOP/s per chip = steps/s, MFU = a quarter.
    utilisation.store_host_peak(str(tmp_path / "cache"), "float32", 4e12)
    used = utilisation.Utilisation(1e12, Target("cpu", 8, 1), "float32", str(tmp_path / "cache"))
    log = callbacks.StepLog(0, cfg, writer, ["loss"], lambda: used)
    fit([log], steps=9, steps_per_execution=3)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    # Executions end at 3, 6, 9: 6 crosses 4, 9 crosses 8 and is the last step.
    assert [int(line.split()[1].split("/")[0]) for line in lines] == [6, 9]
    assert all("steps/s" in line and "lr " in line for line in lines)
    for line in lines:
        rate = float(re.search(r"([\d.]+) steps/s", line).group(1))
        tflops = float(re.search(r"([\d.]+) TFLOP/s/chip", line).group(1))
        mfu = float(re.search(r"MFU +([\d.]+)%", line).group(1)) / 100
        assert tflops == pytest.approx(rate, abs=0.01) and mfu == pytest.approx(rate / 4, abs=0.002)
    writer.flush()
    assert sorted(scalar_events(tmp_path / "logs")["model_flops_utilization"]) == [6, 9]
    rates = scalar_events(tmp_path / "logs")["learning_rate"]
    assert sorted(rates) == list(range(1, 10))
    assert rates[3] == pytest.approx(log.learning_rate(3)) and rates[1] < rates[3]  # warm-up rises


def test_goodput_progress_records_at_each_log_boundary_and_the_last_step(float32_policy):
    recorded = []
    fit([callbacks.GoodputProgress(0, 4, 9, recorded.append)], steps=9, steps_per_execution=3)
    assert recorded == [6, 9]  # 6 crosses 4, 9 crosses 8
    recorded.clear()
    fit([callbacks.GoodputProgress(0, 8, 9, recorded.append)], steps=9, steps_per_execution=3)
    assert recorded == [9]  # 9 crosses 8 ...
    recorded.clear()
    fit([callbacks.GoodputProgress(0, 4, 10, recorded.append)], steps=10, steps_per_execution=2)
    assert recorded == [4, 8, 10]  # ... and 10 is the last step


def test_profile_window_traces_its_steps(float32_policy, tmp_path, capsys):
    window = callbacks.ProfileWindow(0, (2, 4), str(tmp_path))
    fit([window], steps=8, steps_per_execution=2)
    assert not window.profiling
    assert list((tmp_path / "logs" / "plugins" / "profile").rglob("*.xplane.pb"))
    printed = capsys.readouterr().out
    assert "profiling from step 2" in printed and "profile written to" in printed


def test_checkpoints_at_each_boundary_and_their_time(float32_policy, tmp_path):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=5)
    checkpoints = callbacks.Checkpoints(0, manager, checkpoint_every=4)
    fit([checkpoints], steps=9, steps_per_execution=3)
    assert [path.rsplit("-", 1)[1] for path in manager.checkpoints] == ["6", "9"]
    assert len(checkpoints.save_seconds) == 2 and checkpoints.saved(9) and not checkpoints.saved(6)


class SendSigterm(callbacks.BetweenExecutions):
    def on_execution_end(self, step, previous, logs):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_at_the_next_boundary_and_stops(float32_policy, tmp_path):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=5)
    checkpoints = callbacks.Checkpoints(0, manager, checkpoint_every=100)
    stop = callbacks.Preemption(0, checkpoints, poll_seconds=60)
    before = signal.getsignal(signal.SIGTERM)
    with stop.watching():
        assert signal.getsignal(signal.SIGTERM) == stop.request_stop
        model = fit([SendSigterm(0), checkpoints, stop], steps=20, steps_per_execution=2)
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
    assert stop.reason == "SIGTERM"
    assert int(model.optimizer.iterations.numpy()) == 4  # stopped at the boundary the signal arrived in
    assert [path.rsplit("-", 1)[1] for path in manager.checkpoints] == ["4"]


def test_a_notice_from_another_thread_saves_once_even_on_a_checkpoint_boundary(float32_policy, tmp_path):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=5)
    checkpoints = callbacks.Checkpoints(0, manager, checkpoint_every=6)
    stop = callbacks.Preemption(0, checkpoints, poll_seconds=60)

    class NoticeAtStep6(callbacks.BetweenExecutions):
        def on_execution_end(self, step, previous, logs):
            if step == 6:
                watcher = threading.Thread(target=stop.notice, args=("host maintenance: instance/maintenance-event=X",))
                watcher.start()
                watcher.join()

    model = fit([NoticeAtStep6(0), checkpoints, stop], steps=20, steps_per_execution=2)
    assert int(model.optimizer.iterations.numpy()) == 6
    assert [path.rsplit("-", 1)[1] for path in manager.checkpoints] == ["6"] and len(checkpoints.save_seconds) == 1


def periodic_evaluation(cfg, tmp_path, results):
    """A PeriodicEvaluation whose evaluations return `results` in turn (the headline metric's value)."""
    variable = tf.Variable(0.0)
    checkpoint = tf.train.Checkpoint(step=variable)
    best_manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / "checkpoints" / "best"), max_to_keep=1)
    values = iter(results)
    names = metric_names(cfg, input_pipeline.read_manifest(cfg.data.dir, cfg.data))
    evaluation = callbacks.PeriodicEvaluation(
        0,
        cfg,
        evaluate=lambda: dict.fromkeys(names, next(values)),
        best_manager=best_manager,
        history=[],
        metric_names=names,
        write_summaries=lambda metrics, step: None,
        describe=lambda metrics: "scripted",
    )
    return evaluation, variable, checkpoint, best_manager


def test_periodic_evaluation_runs_at_its_boundaries_before_the_last_step(float32_policy, data_dir, tmp_path):
    cfg = tiny_config(data_dir, tmp_path, "train.total_steps=12", "train.eval_every=4")
    evaluation, *_ = periodic_evaluation(cfg, tmp_path, [1.0, 2.0, 3.0])
    fit([evaluation], steps=12, steps_per_execution=2)
    assert [entry["step"] for entry in evaluation.history] == [4, 8]  # 12 is the final evaluation's
    assert evaluation.seconds > 0


def test_no_evaluation_starts_once_training_stops(float32_policy, data_dir, tmp_path):
    cfg = tiny_config(data_dir, tmp_path, "train.total_steps=12", "train.eval_every=4")
    evaluation, *_ = periodic_evaluation(cfg, tmp_path, [1.0])

    class StopAt4(callbacks.BetweenExecutions):
        def on_execution_end(self, step, previous, logs):
            self.model.stop_training = step >= 4

    fit([StopAt4(0), evaluation], steps=12, steps_per_execution=2)
    assert evaluation.history == []


def test_the_best_evaluation_is_kept_even_when_a_later_one_is_worse(data_dir, tmp_path):
    """Evaluations whose headline goes good, best, worse (by the task's direction): the kept
    checkpoint, best_step and best_<metric> are the middle one's, not the latest's."""
    task = tasks.current()
    cfg = tiny_config(data_dir, tmp_path)
    values = [0.5, 0.9, 0.7] if task.higher_is_better else [0.7, 0.1, 0.5]
    evaluation, variable, checkpoint, best_manager = periodic_evaluation(cfg, tmp_path, [])
    names = evaluation.metric_names
    for step, value in zip((10, 20, 30), values):
        variable.assign(step)  # what the checkpoint of this evaluation holds
        evaluation.record(step, {name: value for name in names})
    assert evaluation.best() == {"step": 20, **{name: values[1] for name in names}}
    summary = evaluation.summary()
    assert summary["best_step"] == 20 and summary[f"best_{task.headline_metric}"] == values[1]
    variable.assign(0)
    checkpoint.restore(best_manager.latest_checkpoint).assert_consumed()
    assert best_manager.latest_checkpoint.endswith("ckpt-20") and float(variable.numpy()) == 20.0
