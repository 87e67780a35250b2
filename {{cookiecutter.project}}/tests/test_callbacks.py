"""Each between-execution concern of the trainer (callbacks.py), alone, on a tiny Keras model that
`fit` trains for a few steps in a fraction of a second: what it does at which step."""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_config
from {{ cookiecutter.package }}.core import callbacks, goodput, input_pipeline, utilisation
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core.keras import keras
from {{ cookiecutter.package }}.core.model import metric_names
from {{ cookiecutter.package }}.core.topology import Target


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


def test_first_execution_books_the_first_execution_apart_once(float32_policy, capsys):
    clock, report = goodput.PhaseClock(), callbacks.Report(step=0)
    with clock.phase(goodput.TRAINING):
        fit([callbacks.FirstExecution(0, clock, report)], steps=6, steps_per_execution=2)
    seconds = clock.so_far()
    assert seconds[goodput.FIRST_EXECUTION] > 0 and seconds[goodput.TRAINING] >= 0
    # Booked after training began, listed before it: the timings line follows a start's order.
    assert list(seconds) == [goodput.START_UP, goodput.FIRST_EXECUTION, goodput.TRAINING]
    assert (report.first_step, report.step) == (2, 6)
    printed = capsys.readouterr().out
    assert printed.count("time to first step") == 1
    rate = report.examples_per_second(4)
    assert math.isfinite(rate) and rate > 0
    assert math.isnan(callbacks.Report(step=0).examples_per_second(4))  # nothing timed


class Boundaries(callbacks.BetweenExecutions):
    """After FirstExecution: when its work at each boundary ended, and a periodic evaluation's
    seconds reported at the first boundary (a stand-in: nothing is evaluated)."""

    def __init__(self, report: callbacks.Report):
        super().__init__(0)
        self.report, self.ended = report, []

    def on_execution_end(self, step, previous, logs):
        if not self.ended:
            self.report.evaluation_seconds += 0.25
        self.ended.append(time.perf_counter())


def test_throughput_is_timed_from_the_second_execution_after_the_first_boundarys_work(float32_policy):
    """The window a bare fit is timed over in `make bench`: the first boundary's work (the model FLOPs
    count, set-ups, an evaluation there) falls before it, every later boundary inside it."""
    clock, report = goodput.PhaseClock(), callbacks.Report(step=0)
    later = Boundaries(report)
    with clock.phase(goodput.TRAINING):
        fit([callbacks.FirstExecution(0, clock, report), later], steps=6, steps_per_execution=2)
    assert later.ended[0] < report.first_time < later.ended[1] < report.end_time
    assert report.first_step == 2 and report.untimed_evaluation_seconds == 0.25


def test_examples_per_second_leaves_out_the_evaluations_inside_its_window():
    report = callbacks.Report(step=10, first_step=4, first_time=100.0, end_time=103.0)
    report.evaluation_seconds, report.untimed_evaluation_seconds = 1.5, 0.5  # 0.5 s of it before the window
    assert report.examples_per_second(4) == pytest.approx(6 * 4 / (3.0 - 1.0))


def test_what_several_callbacks_report_has_one_writer_each():
    """The saves' seconds, the evaluations and the stop are read as copies and written by one method
    each: editing a copy changes nothing; a wait is added onto this start's last save (none before
    its first); a preemption stands over an early stop whichever comes first, else the first reason
    stands; an evaluation recorded again at its step replaces it."""
    report = callbacks.Report(step=0, earlier=[{"step": 4, "loss": 1.0}])
    report.history.append({"step": 8, "loss": 0.0})
    report.checkpoint_blocking_seconds.append(1.0)
    report.checkpoint_write_seconds.append(1.0)
    assert report.history == [{"step": 4, "loss": 1.0}]
    assert report.checkpoint_blocking_seconds == report.checkpoint_write_seconds == []
    report.hold(0.5, onto_last=True)  # no save of this start yet: nothing to add it to
    report.hold(0.25)
    report.hold(0.5, onto_last=True)
    report.hold(1.0)
    report.written(2.0)
    assert report.checkpoint_blocking_seconds == [0.75, 1.0] and report.checkpoint_write_seconds == [2.0]
    early = callbacks.Stop(goodput.STOPPED_EARLY, "eval_loss did not improve")
    preempted = callbacks.Stop(goodput.PREEMPTED, "SIGTERM")
    for first, second, stands in (
        (early, preempted, preempted),
        (preempted, early, preempted),
        (preempted, callbacks.Stop(goodput.PREEMPTED, "host maintenance"), preempted),
        (early, callbacks.Stop(goodput.STOPPED_EARLY, "another"), early),
    ):
        stopped = callbacks.Report(step=0)
        stopped.stop_with(first)
        stopped.stop_with(second)
        assert stopped.stop == stands
    with pytest.raises(AttributeError):
        report.stop = early
    assert report.record_evaluation(4, {"loss": 2.0}, ["loss"], "eval_loss", "min")  # replaces step 4's: the only one
    assert not report.record_evaluation(6, {"loss": 3.0}, ["loss"], "eval_loss", "min")
    assert report.record_evaluation(8, {"loss": 0.5}, ["loss"], "eval_loss", "min")
    assert report.history == [{"step": 4, "loss": 2.0}, {"step": 6, "loss": 3.0}, {"step": 8, "loss": 0.5}]


def test_scalar_series_writes_each_step_under_its_own_tag(tmp_path):
    from test_train import scalar_events

    writer = tf.summary.create_file_writer(str(tmp_path))
    write = callbacks.scalar_series("learning_rate")
    with writer.as_default():
        write(tf.constant([5, 6, 7], tf.int64), tf.constant([0.5, 0.25, 0.125], tf.float32))
        write(tf.constant([], tf.int64, [0]), tf.constant([], tf.float32, [0]))  # nothing to write
        write(tf.constant([8], tf.int64), tf.constant([0.0625], tf.float32))
    writer.flush()
    assert scalar_events(tmp_path) == {"learning_rate": {5: 0.5, 6: 0.25, 7: 0.125, 8: 0.0625}}


def test_the_phase_clock_books_each_block_to_its_phase_and_resumes_the_enclosing_one():
    now = [100.0]  # the clock's time source, moved by hand: the booking is exact, whatever the machine's load
    clock = goodput.PhaseClock(now=lambda: now[0])
    with clock.phase(goodput.TRAINING):
        now[0] += 0.05
        with clock.phase(goodput.EVALUATION):
            now[0] += 0.1
        now[0] += 0.05
    now[0] += 0.02
    seconds = clock.so_far()
    assert list(seconds) == [goodput.START_UP, goodput.TRAINING, goodput.EVALUATION]
    assert seconds == {goodput.START_UP: 0.02, goodput.TRAINING: 0.1, goodput.EVALUATION: 0.1}
    clock.move(0.05, goodput.TRAINING, goodput.END_OF_FIT)
    assert clock.so_far()[goodput.END_OF_FIT] == 0.05
    assert goodput.PhaseClock()._now is time.perf_counter  # the real clock by default


def test_nan_guard_stops_before_anything_is_saved(float32_policy, tmp_path):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=2)
    checkpoints = callbacks.Checkpoints(0, manager, checkpoint_every=2, report=callbacks.Report(step=0))
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
    report = callbacks.Report(step=0)
    log = callbacks.StepLog(0, cfg, writer, ["loss"], lambda: used, report)
    fit([log], steps=9, steps_per_execution=3)
    assert report.utilisation is used
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
    assert all(rates[step] == pytest.approx(log.learning_rate(step)) for step in rates)


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


def test_checkpoints_at_each_boundary_and_their_time(float32_policy, tmp_path, capsys):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=5)
    report = callbacks.Report(step=0)
    fit([callbacks.Checkpoints(0, manager, checkpoint_every=4, report=report)], steps=9, steps_per_execution=3)
    assert [path.rsplit("-", 1)[1] for path in manager.checkpoints] == ["6", "9"]
    assert len(report.checkpoint_blocking_seconds) == 2 and len(report.checkpoint_write_seconds) == 2
    callbacks.save_checkpoint(manager, 9, report)  # the newest already is step 9: not saved again
    assert len(report.checkpoint_blocking_seconds) == 2 and len(manager.checkpoints) == 2
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("checkpoint")]
    assert [line.split(":")[0] for line in lines] == ["checkpoint at step 6 saved", "checkpoint at step 9 saved"]


class SendSigterm(callbacks.BetweenExecutions):
    def on_execution_end(self, step, previous, logs):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_at_the_next_boundary_and_stops(float32_policy, tmp_path):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=5)
    report = callbacks.Report(step=0)
    checkpoints = callbacks.Checkpoints(0, manager, checkpoint_every=100, report=report)
    stop = callbacks.Preemption(0, manager, poll_seconds=60, report=report)
    before = signal.getsignal(signal.SIGTERM)
    with stop.watching():
        assert signal.getsignal(signal.SIGTERM) == stop.request_stop
        model = fit([SendSigterm(0), checkpoints, stop], steps=20, steps_per_execution=2)
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
    assert report.stop == callbacks.Stop(goodput.PREEMPTED, "SIGTERM")
    assert int(model.optimizer.iterations.numpy()) == 4  # stopped at the boundary the signal arrived in
    assert [path.rsplit("-", 1)[1] for path in manager.checkpoints] == ["4"]


def test_a_notice_after_the_last_boundary_still_saves_and_reports_a_preemption(float32_policy, tmp_path):
    """A notice while fit releases its input, after the last execution's boundary: the watch's end
    saves the step reached and reports the stop, so the start still ends as preempted."""
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=5)
    report = callbacks.Report(step=0)
    stop = callbacks.Preemption(0, manager, poll_seconds=60, report=report)
    with stop.watching():
        fit([callbacks.FirstExecution(0, goodput.PhaseClock(), report), stop], steps=4, steps_per_execution=2)
        assert report.stop is None and manager.checkpoints == []
        stop.notice("the metadata server reports instance/preempted=TRUE")
    assert report.stop == callbacks.Stop(goodput.PREEMPTED, "the metadata server reports instance/preempted=TRUE")
    assert [path.rsplit("-", 1)[1] for path in manager.checkpoints] == ["4"]


def test_a_notice_from_another_thread_saves_once_even_on_a_checkpoint_boundary(float32_policy, tmp_path):
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=5)
    report = callbacks.Report(step=0)
    checkpoints = callbacks.Checkpoints(0, manager, checkpoint_every=6, report=report)
    stop = callbacks.Preemption(0, manager, poll_seconds=60, report=report)

    class NoticeAtStep6(callbacks.BetweenExecutions):
        def on_execution_end(self, step, previous, logs):
            if step == 6:
                watcher = threading.Thread(target=stop.notice, args=("host maintenance: instance/maintenance-event=X",))
                watcher.start()
                watcher.join()

    model = fit([NoticeAtStep6(0), checkpoints, stop], steps=20, steps_per_execution=2)
    assert int(model.optimizer.iterations.numpy()) == 6
    assert [path.rsplit("-", 1)[1] for path in manager.checkpoints] == ["6"]
    assert len(report.checkpoint_blocking_seconds) == 1
    assert report.stop.end == goodput.PREEMPTED and report.stop.detail.startswith("host maintenance")


class Logs(callbacks.BetweenExecutions):
    """Keeps the logs of every execution, as a callback after the others sees them."""

    def __init__(self):
        super().__init__(0)
        self.seen = {}

    def on_execution_end(self, step, previous, logs):
        self.seen[step] = dict(logs)


def periodic_evaluation(cfg, tmp_path, results, report):
    """A PeriodicEvaluation whose evaluations return `results` in turn (every metric's value), kept
    by the task's headline metric in its direction."""
    variable = tf.Variable(0.0)
    checkpoint = tf.train.Checkpoint(step=variable)
    best_manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / "checkpoints" / "best"), max_to_keep=1)
    values = iter(results)

    def evaluate() -> dict:
        variable.assign_add(1.0)  # the weights of the n-th evaluation: n
        return dict.fromkeys(names, next(values))

    task = tasks.load(cfg.task)
    names = metric_names(cfg, task, input_pipeline.read_manifest(cfg.data.dir, task, cfg.data))
    evaluation = callbacks.PeriodicEvaluation(
        0,
        cfg.train.eval_every,
        cfg.train.total_steps,
        evaluate=evaluate,
        best_manager=best_manager,
        monitor=f"eval_{task.headline_metric}",
        mode="max" if task.higher_is_better else "min",
        metric_names=names,
        write_summaries=lambda metrics, step: None,
        describe=lambda metrics: "scripted",
        report=report,
    )
    return evaluation, names, best_manager, variable


def test_periodic_evaluation_runs_at_its_boundaries_before_the_last_step_into_the_logs(
    float32_policy, data_dir, tmp_path
):
    cfg = tiny_config(data_dir, tmp_path, "train.total_steps=12", "train.eval_every=4")
    report, logs = callbacks.Report(step=0), Logs()
    evaluation, names, best_manager, variable = periodic_evaluation(cfg, tmp_path, [1.0, 2.0, 3.0], report)
    fit([evaluation, logs], steps=12, steps_per_execution=2)
    assert [entry["step"] for entry in report.history] == [4, 8]  # 12 is the final evaluation's
    assert report.evaluation_seconds > 0
    # The callbacks after it see eval_<metric> in the logs of the executions that evaluated, only those.
    assert {step for step, seen in logs.seen.items() if f"eval_{names[0]}" in seen} == {4, 8}
    assert all(logs.seen[8][f"eval_{name}"] == 2.0 for name in names)
    higher = tasks.load(cfg.task).higher_is_better
    assert best_manager.latest_checkpoint.endswith("ckpt-8" if higher else "ckpt-4")
    # The kept checkpoint holds the best evaluation's weights (the 2nd's if higher is better, else the 1st's).
    tf.train.Checkpoint(step=variable).restore(best_manager.latest_checkpoint).assert_consumed()
    assert float(variable.numpy()) == (2.0 if higher else 1.0)
    assert report.last_evaluation == (8, dict.fromkeys(names, 2.0))


def test_no_evaluation_starts_once_training_stops(float32_policy, data_dir, tmp_path):
    cfg = tiny_config(data_dir, tmp_path, "train.total_steps=12", "train.eval_every=4")
    report = callbacks.Report(step=0)
    evaluation, *_ = periodic_evaluation(cfg, tmp_path, [1.0], report)

    class StopAt4(callbacks.BetweenExecutions):
        def on_execution_end(self, step, previous, logs):
            self.model.stop_training = step >= 4

    fit([StopAt4(0), evaluation], steps=12, steps_per_execution=2)
    assert report.history == []


def test_the_best_evaluation_is_kept_even_when_a_later_one_is_worse(data_dir, tmp_path):
    """Evaluations whose headline goes good, best, worse (by the task's direction): the best one,
    best_step and best_<metric> are the middle one's, not the latest's."""
    task = tasks.load(tasks.DEFAULT)
    cfg = tiny_config(data_dir, tmp_path)
    monitor, mode = f"eval_{task.headline_metric}", "max" if task.higher_is_better else "min"
    values = [0.5, 0.9, 0.7] if task.higher_is_better else [0.7, 0.1, 0.5]
    names = metric_names(cfg, task, input_pipeline.read_manifest(cfg.data.dir, task, cfg.data))
    history = []
    best = [
        callbacks.record_evaluation(history, step, dict.fromkeys(names, value), names, monitor, mode)
        for step, value in zip((10, 20, 30), values)
    ]
    assert best == [True, True, False]
    assert callbacks.best_evaluation(history, monitor, mode) == {"step": 20, **dict.fromkeys(names, values[1])}
    summary = callbacks.evaluation_summary(history, monitor, mode)
    assert summary["best_step"] == 20 and summary[f"best_{task.headline_metric}"] == values[1]
    # A rerun's evaluation of a step replaces that step's entry.
    callbacks.record_evaluation(history, 30, dict.fromkeys(names, values[1]), names, monitor, mode)
    assert [entry["step"] for entry in history] == [10, 20, 30]


class Evaluations(callbacks.BetweenExecutions):
    """Puts scripted `eval_loss` values into the logs every `every` steps, as PeriodicEvaluation does."""

    def __init__(self, every, values):
        super().__init__(0)
        self.every, self.values = every, iter(values)

    def on_execution_end(self, step, previous, logs):
        if callbacks.crossed(self.every, previous, step):
            logs["eval_loss"] = next(self.values)


@pytest.mark.parametrize(
    "mode, values, min_delta, stop_step",
    [
        ("min", [1.0, 1.0, 1.0, 1.0], 0.0, 12),  # no change: the third evaluation stops it
        ("min", [1.0, 0.9, 0.95, 0.8, 0.85, 0.9], 0.0, 24),  # improvements reset the count
        ("min", [1.0, 0.999, 0.998, 0.5], 0.01, 12),  # smaller than min_delta is no improvement
        ("max", [1.0, 0.9, 0.8, 2.0], 0.0, 12),  # higher is better: falling is no improvement
        ("max", [1.0, 1.0, 1.0, 2.0], 0.0, 12),  # nor is staying level
        ("max", [1.0, 1.001, 1.002, 2.0], 0.01, 12),  # rising by less than min_delta is no improvement either
        ("max", [1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16, 1.18], 0.01, None),  # beyond it: on
        ("min", [1.0, 0.98, 0.96, 0.94, 0.92, 0.9, 0.88, 0.86, 0.84, 0.82], 0.01, None),
        ("min", [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1], 0.0, None),  # never stops
    ],
)
def test_early_stopping_after_patience_evaluations_without_improvement(
    float32_policy, mode, values, min_delta, stop_step
):
    report = callbacks.Report(step=0)
    stopping = callbacks.EarlyStopping(0, "eval_loss", mode, 2, min_delta, [], report)
    model = fit([Evaluations(4, values), stopping], steps=40, steps_per_execution=2)
    stopped = int(model.optimizer.iterations.numpy())
    if stop_step is None:
        assert stopped == 40 and report.stop is None
    else:
        assert stopped == stop_step and report.stop.end == goodput.STOPPED_EARLY
        assert "did not improve" in report.stop.detail and "train.early_stop_patience=2" in report.stop.detail


def test_early_stopping_counts_on_from_the_runs_earlier_evaluations(float32_policy):
    """A resumed run: one evaluation without improvement before the restart, so one more stops it."""
    report = callbacks.Report(step=0)
    history = [{"step": 4, "loss": 1.0}, {"step": 8, "loss": 1.0}]
    stopping = callbacks.EarlyStopping(0, "eval_loss", "min", 2, 0.0, history, report)
    model = fit([Evaluations(4, [1.0, 1.0]), stopping], steps=20, steps_per_execution=2)
    assert int(model.optimizer.iterations.numpy()) == 4 and report.stop.end == goodput.STOPPED_EARLY
