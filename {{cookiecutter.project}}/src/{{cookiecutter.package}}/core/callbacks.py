"""What happens between executions of the training step, one Keras callback per concern.

Keras calls back once per execution (every `steps_per_execution` steps), so each action happens at
the first execution boundary at or after its step. The trainer composes them in one list, in this
order (trainer.py, `Trainer.callbacks`):

    FirstExecution      books the first execution (tracing, compilation) apart from training
    NanGuard            a non-finite loss stops the run without saving
    StepLog             the log line, TensorBoard scalars, the learning rate of every step
    GoodputProgress     this start's progress in the run record, so a kill leaves it
    ProfileWindow       traces runtime.profile_steps
    Checkpoints         a checkpoint every train.checkpoint_every steps (in the background with
                        train.async_checkpoint)
    Preemption          SIGTERM or a metadata notice: a whole checkpoint now, then stop
    PeriodicEvaluation  every train.eval_every steps: `eval_<metric>` into Keras' logs; the best
                        evaluation's checkpoint (by a monitor and a mode) is kept apart
    EarlyStopping       train.early_stop_patience evaluations without improvement: stop
    ... the task's own  `Task.build_callbacks` (core/task.py): any Keras callback, after these

A callback reads what it needs from Keras' `logs` and its constructor, and hands what it learned to
the trainer through the one `Report` it is given; nothing reads a callback's attributes. Another
concern (a metric upload, a custom stop) is another callback in that list: a Keras callback sees
`eval_<metric>` in the logs of the executions that evaluated.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from typing import Callable, Sequence

import tensorflow as tf

from . import goodput, preemption, schedule
from .errors import UserError
from .keras import keras
from .run_dir import checkpoint_step, run_path


@dataclasses.dataclass(frozen=True)
class Stop:
    """Why training stopped before `train.total_steps`: `end` is one of goodput's ends (PREEMPTED,
    STOPPED_EARLY); `detail` says what asked for it."""

    end: str
    detail: str


@dataclasses.dataclass
class Report:
    """What the callbacks learned during fit, for the trainer. Each field has one writer: the callback
    named beside it, or, for what several reach (the saves' seconds, the evaluations, why training
    stopped), the one method of the report that writes it (`hold`, `written`, `record_evaluation`,
    `stop_with`); those are read as copies."""

    step: int
    """The optimizer's step fit reached (FirstExecution, at every boundary)."""
    first_step: int = 0
    """The step after the first execution, from which throughput is measured (FirstExecution)."""
    first_time: float | None = None
    """perf_counter when the second execution began (FirstExecution): throughput is timed from there
    to `end_time`, the first execution and the work at its end (the model FLOPs count, first
    traces) left out, as `make bench` times a bare fit; None: no second execution began."""
    untimed_evaluation_seconds: float = 0.0
    """The part of `evaluation_seconds` before `first_time` (FirstExecution)."""
    end_time: float = 0.0
    """perf_counter when fit ended (FirstExecution)."""
    utilisation: object | None = None
    """The model FLOPs per step against the chip's peak (StepLog, after the first execution)."""
    evaluation_seconds: float = 0.0
    """Wall seconds of this start's periodic evaluations (PeriodicEvaluation)."""
    last_evaluation: tuple[int, dict] | None = None
    """The step and metrics of this start's latest periodic evaluation (PeriodicEvaluation): an early
    stop's final evaluation is that one, not a second pass over the same weights."""
    earlier: dataclasses.InitVar[Sequence[dict]] = ()
    """The run's evaluations before this start (its record's history), where `history` begins."""
    _blocking: list = dataclasses.field(default_factory=list, init=False, repr=False)
    _writes: list = dataclasses.field(default_factory=list, init=False, repr=False)
    _history: list = dataclasses.field(default_factory=list, init=False, repr=False)
    _stop: Stop | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self, earlier: Sequence[dict]) -> None:
        self._history = [dict(entry) for entry in earlier]

    @property
    def checkpoint_blocking_seconds(self) -> list[float]:
        """The seconds each checkpoint save held the step loop (`save_checkpoint`: Checkpoints,
        Preemption, the trainer's last save): the save call, and before it the wait for the save before
        it if that one was still being written in the background. A last save whose step is saved
        already adds its wait for that save's files to that save's. The set-up of background saves
        (Checkpoints, at the first boundary) is added to the save of that boundary, or is an entry of
        its own before the saves' where the boundary saves nothing."""
        return list(self._blocking)

    @property
    def checkpoint_write_seconds(self) -> list[float]:
        """The wall seconds from each save's call until its files were whole, in the background for an
        asynchronous one (`save_checkpoint`): what a preemption notice must leave time for."""
        return list(self._writes)

    @property
    def history(self) -> list[dict]:
        """Every periodic evaluation of the run, earlier starts' included: {"step", metric: value}
        (PeriodicEvaluation during fit, the trainer's final evaluation after it: `record_evaluation`)."""
        return [dict(entry) for entry in self._history]

    @property
    def stop(self) -> Stop | None:
        """Why training stopped early, if it did (Preemption, EarlyStopping: `stop_with`)."""
        return self._stop

    def hold(self, seconds: float, *, onto_last: bool = False) -> None:
        """A save (or the background saves' set-up) held training `seconds`: an entry of its own, or
        added to the last one's (`onto_last`: the same boundary's, or the wait for that save's files;
        nothing where this start has saved nothing yet)."""
        if not onto_last:
            self._blocking.append(seconds)
        elif self._blocking:
            self._blocking[-1] += seconds

    def written(self, seconds: float) -> None:
        """A save's files are whole, `seconds` after its call (from the background writer's thread)."""
        self._writes.append(seconds)

    def record_evaluation(self, step: int, metrics: dict, names: list[str], monitor: str, mode: str) -> bool:
        """Adds an evaluation to `history` (`record_evaluation` below); whether it is the best so far."""
        return record_evaluation(self._history, step, metrics, names, monitor, mode)

    def stop_with(self, stop: Stop) -> None:
        """Records why training stops. A preemption stands over an early stop (its checkpoint is saved
        and the process must end before the VM does); otherwise the first reason stands."""
        if self._stop is None or (stop.end == goodput.PREEMPTED and self._stop.end != goodput.PREEMPTED):
            self._stop = stop

    def examples_per_second(self, batch_size: int) -> float:
        """Training throughput after the first execution, the periodic evaluations left out; NaN when
        no step was timed."""
        evaluated = self.evaluation_seconds - self.untimed_evaluation_seconds
        elapsed = self.end_time - (self.first_time or self.end_time) - evaluated
        steps = self.step - self.first_step
        return steps * batch_size / elapsed if steps and elapsed > 0 else float("nan")


def crossed(every: int, previous: int, step: int) -> bool:
    """Whether a multiple of `every` lies in (previous, step]: an execution of several steps crosses
    a boundary without landing on it."""
    return bool(every) and step // every > previous // every


class BetweenExecutions(keras.callbacks.Callback):
    """A callback that acts on the optimizer's step, the one a checkpoint restores: `on_execution_end`
    gets the step reached and the step the previous execution ended at."""

    def __init__(self, initial_step: int):
        super().__init__()
        self.step = initial_step

    def on_train_batch_end(self, batch, logs=None):
        previous, self.step = self.step, int(self.model.optimizer.iterations.numpy())
        self.on_execution_end(self.step, previous, logs or {})

    def on_execution_end(self, step: int, previous: int, logs: dict) -> None:
        raise NotImplementedError


class FirstExecution(BetweenExecutions):
    """Books the first execution (fit's set-up, tracing, compilation: the training phase so far) to
    its own phase of the clock at the first boundary and prints the time to first step; reports the
    step reached at every boundary and what training throughput is measured from: the start of the
    second execution, after every callback's work at the first boundary."""

    def __init__(self, initial_step: int, clock: goodput.PhaseClock, report: Report):
        super().__init__(initial_step)
        self.clock, self.report = clock, report
        self.first_boundary_passed = False
        report.first_step = initial_step

    def on_execution_end(self, step, previous, logs):
        self.report.step = step
        if not self.first_boundary_passed:
            self.first_boundary_passed = True
            self.report.first_step = step
            self.clock.move_all(goodput.TRAINING, goodput.FIRST_EXECUTION)  # fit's set-up included
            print(self.clock.describe_first_step(), flush=True)

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_boundary_passed and self.report.first_time is None:
            self.report.first_time = time.perf_counter()
            self.report.untimed_evaluation_seconds = self.report.evaluation_seconds

    def on_train_end(self, logs=None):
        self.report.end_time = time.perf_counter()


class NonFiniteLoss(UserError):
    """The loss became NaN or infinite: nothing after it is saved."""


class NanGuard(BetweenExecutions):
    """Stops at the first execution whose loss is not finite, before anything saves it; the message
    names the last good checkpoint."""

    def __init__(self, initial_step: int, manager: tf.train.CheckpointManager):
        super().__init__(initial_step)
        self.manager = manager

    def on_execution_end(self, step, previous, logs):
        if not math.isfinite(float(logs["loss"])):
            self.manager.sync()  # a save still being written in the background is a good one
            kept = self.manager.latest_checkpoint or "none"
            raise NonFiniteLoss(
                f"the loss became NaN at step {step}; stopped without saving (last good checkpoint: {kept}); "
                "lower train.base_learning_rate or check the data"
            )


class StepLog(BetweenExecutions):
    """Every `train.log_every` steps (and at the last): one line with the loss, the task's metrics,
    the learning rate and the throughput; the same in TensorBoard. Metrics are reset after each
    line, so each covers the steps since the one before (Keras would report means since fit began)."""

    def __init__(
        self,
        initial_step: int,
        cfg,
        writer,
        metric_names: list[str],
        utilisation: Callable[[], object],
        report: Report,
    ):
        super().__init__(initial_step)
        self.cfg, self.writer, self.metric_names, self.report = cfg, writer, metric_names, report
        self.peak = schedule.scaled_learning_rate(
            cfg.train.base_learning_rate, cfg.effective_batch_size, cfg.train.base_batch_size
        )
        self.last_step, self.last_time = initial_step, None
        # The model FLOPs are counted after the first execution (tracing the model takes a moment,
        # kept out of the time to first step and out of the timed windows).
        self.make_utilisation, self.utilisation = utilisation, None
        # Every step's learning rate in one call a boundary: an eager summary op per step cost more
        # than the rest of the step log (traced at the first boundary, outside the timed window).
        self.write_learning_rates = scalar_series("learning_rate")

    def learning_rate(self, step: int) -> float:
        return schedule.learning_rate_at(step, self.peak, self.cfg.train.warmup_steps, self.cfg.train.total_steps)

    def on_execution_end(self, step, previous, logs):
        now = time.perf_counter()
        if self.last_time is None:  # the first execution (compilation) is not timed
            self.utilisation = self.report.utilisation = self.make_utilisation()
            print(self.utilisation.describe(), flush=True)
            now = time.perf_counter()
            self.last_step, self.last_time = step, now
        with self.writer.as_default():
            # The schedule is a pure function of the step: every step's rate is logged, not only the last.
            steps = list(range(previous + 1, step + 1))
            rates = [self.learning_rate(each) for each in steps]
            self.write_learning_rates(
                tf.constant(steps, tf.int64, [len(steps)]), tf.constant(rates, tf.float32, [len(rates)])
            )
            for name in self.metric_names:
                tf.summary.scalar(name, logs[name], step=step)
        if crossed(self.cfg.train.log_every, previous, step) or step == self.cfg.train.total_steps:
            self.log(step, logs, now)

    def log(self, step: int, logs: dict, now: float) -> None:
        steps = step - self.last_step
        rate = steps / (now - self.last_time) if steps and now > self.last_time else float("nan")
        examples = rate * self.cfg.effective_batch_size
        self.last_step, self.last_time = step, now
        values = "  ".join(f"{name} {logs[name]:.4f}" for name in self.metric_names)
        tflops, mfu = self.utilisation.tflops_per_chip(rate), self.utilisation.mfu(rate)
        print(
            f"step {step:6d}/{self.cfg.train.total_steps}  {values}  lr {self.learning_rate(step):.5f}  "
            f"{rate:7.2f} steps/s  {examples:9.1f} examples/s  {self.utilisation.describe_rate(rate)}",
            flush=True,
        )
        if math.isfinite(rate):
            with self.writer.as_default():
                tf.summary.scalar("steps_per_second", rate, step=step)
                tf.summary.scalar("examples_per_second", examples, step=step)
                if tflops is not None:  # None: the model's FLOPs are unknown (the line says why)
                    tf.summary.scalar("tflops_per_chip", tflops, step=step)
                if mfu is not None:
                    tf.summary.scalar("model_flops_utilization", mfu, step=step)
        self.writer.flush()
        self.model.reset_metrics()


def scalar_series(tag: str):
    """A compiled `write(steps, values)`: the scalar `tag` at each of `steps` (int64) with the value
    of `values` (float32) at the same index, into the default summary writer; the same events as a
    `tf.summary.scalar` per step, in one call."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.float32)])
    def write(steps, values):
        for index in tf.range(tf.size(steps)):
            with tf.compat.v1.name_scope(None):  # the tag as given, not under the loop's name scope
                tf.summary.scalar(tag, values[index], step=steps[index])

    return write


class GoodputProgress(BetweenExecutions):
    """At every log boundary (and the last step), `record(step)` puts this start's progress in the run
    record: a start killed without notice (SIGKILL, a hard stop) still leaves how far it got."""

    def __init__(self, initial_step: int, log_every: int, total_steps: int, record: Callable[[int], object]):
        super().__init__(initial_step)
        self.log_every, self.total_steps, self.record = log_every, total_steps, record

    def on_execution_end(self, step, previous, logs):
        if crossed(self.log_every, previous, step) or step == self.total_steps:
            self.record(step)


class ProfileWindow(BetweenExecutions):
    """Traces the steps of `runtime.profile_steps` (start, stop) into the run's logs/ for
    TensorBoard's Profile tab. `stop()` ends a trace that the run's end cut short."""

    def __init__(self, initial_step: int, window: tuple[int, int] | None, output_dir: str):
        super().__init__(initial_step)
        self.window, self.output_dir = window, output_dir
        self.profiling = False

    def on_execution_end(self, step, previous, logs):
        if not self.window:
            return
        start, stop = self.window
        if not self.profiling and start <= step < stop:
            tf.profiler.experimental.start(run_path(self.output_dir, "logs"))
            self.profiling = True
            print(f"profiling from step {step}", flush=True)
        elif self.profiling and step >= stop:
            self.stop()

    def stop(self) -> None:
        if self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False
            print(f"profile written to {run_path(self.output_dir, 'logs', 'plugins', 'profile')}", flush=True)


class Checkpoints(BetweenExecutions):
    """A checkpoint at every `train.checkpoint_every` boundary, written in the background when
    `asynchronous` (train.async_checkpoint); the seconds each save held training go to the report,
    the log and TensorBoard (`checkpoint_blocking_seconds`).

    Background saves are set up at the first boundary when a save falls within this fit
    (`prepare_background_saves`): the once-per-start work that the first two saves would otherwise
    do in the middle of training. Its seconds count as held: added to the save's at a boundary
    that also saves, an entry of their own otherwise."""

    def __init__(
        self,
        initial_step: int,
        manager: tf.train.CheckpointManager,
        checkpoint_every: int,
        report: Report,
        asynchronous: bool = False,
        writer=None,
    ):
        super().__init__(initial_step)
        self.manager, self.checkpoint_every, self.report = manager, checkpoint_every, report
        self.asynchronous, self.writer = asynchronous, writer
        self.first_boundary = True

    def on_execution_end(self, step, previous, logs):
        set_up = self.set_up(step, previous) if self.first_boundary else 0.0
        self.first_boundary = False
        if crossed(self.checkpoint_every, previous, step):
            saves = len(self.report.checkpoint_blocking_seconds)
            blocked = save_checkpoint(self.manager, step, self.report, self.asynchronous) + set_up
            if set_up:  # this boundary held training for both, where it saved
                self.report.hold(set_up, onto_last=len(self.report.checkpoint_blocking_seconds) > saves)
            if self.writer is not None:
                with self.writer.as_default():
                    tf.summary.scalar("checkpoint_blocking_seconds", blocked, step=step)
        elif set_up:
            self.report.hold(set_up)

    def set_up(self, step: int, initial_step: int) -> float:
        """At the first boundary, the background saves' set-up when a save comes in this fit: the
        seconds it held training (0 where there was nothing to set up)."""
        if not self.asynchronous or not self.saves_in_this_fit(initial_step):
            return 0.0
        started = time.perf_counter()
        if not prepare_background_saves(self.manager):
            return 0.0
        seconds = time.perf_counter() - started
        print(
            f"background checkpoint saves set up at step {step}: training held {seconds:.3f} s (a host copy of "
            "every variable and its copy function traced, once per start, instead of at the first two saves)",
            flush=True,
        )
        return seconds

    def saves_in_this_fit(self, initial_step: int) -> bool:
        """Whether a checkpoint boundary lies in the steps fit was given (Keras' params: the trainer's
        fit is one epoch of `steps`; True when they are not known)."""
        params = self.params or {}
        if params.get("steps") is None:
            return bool(self.checkpoint_every)
        return crossed(self.checkpoint_every, initial_step, initial_step + params["steps"])


def prepare_background_saves(manager: tf.train.CheckpointManager) -> bool:
    """Sets up the background saves of `manager`'s checkpoint now: the host copy of every variable
    and the function that refreshes it at each save, traced and run once, which TensorFlow would
    otherwise do at the first save (the copy) and the second (the trace); every save after this only
    refreshes the copy. The checkpoints written are the same. False, with nothing done, where this
    TensorFlow's checkpoint has no such set-up to call: its saves set themselves up as before."""
    helper_of = getattr(manager.checkpoint, "_async_checkpointer", None)
    helper = helper_of() if callable(helper_of) else None
    initialize, copy = getattr(helper, "_ensure_initialized", None), getattr(helper, "_copy_to_cpu", None)
    if helper is None or getattr(helper, "_initialized", True) or not callable(initialize) or not callable(copy):
        return False
    initialize()  # the host copies and the background writer's thread (TensorFlow's first save)
    copy()  # the copy function traced and run (TensorFlow's second save)
    return True


def save_checkpoint(
    manager: tf.train.CheckpointManager, step: int, report: Report, asynchronous: bool = False
) -> float:
    """A checkpoint of `step`, unless the newest one already is; returns the seconds the call held
    training, which go into the report and one line (and the seconds its files took, into the report
    once they are whole).

    A save still being written in the background is finished first: one write at a time, the
    keep_checkpoints rotation unchanged, and `latest_checkpoint` (like the `checkpoint` index file)
    names a checkpoint only once its files are whole, so the check of the newest step is exact.
    Synchronous (the default, for the preemption's and the run's last save), the checkpoint is whole
    when this returns; asynchronous (`CheckpointOptions(enable_async=True)`), the call copies the
    variables to host memory and a background thread writes the copy while training goes on.
    """
    started = time.perf_counter()
    manager.sync()  # the save in flight, if any: no-op otherwise
    latest = manager.latest_checkpoint
    if latest is not None and checkpoint_step(latest) == step:
        waited = time.perf_counter() - started
        report.hold(waited, onto_last=True)  # for the files of this start's own save of `step`
        return waited
    called = time.perf_counter()

    def written() -> None:  # once its files are whole: in the background thread for an asynchronous save
        report.written(time.perf_counter() - called)

    options = tf.train.CheckpointOptions(enable_async=asynchronous, experimental_write_callbacks=[written])
    manager.save(checkpoint_number=step, options=options)
    blocked = time.perf_counter() - started
    report.hold(blocked)
    how = "saving in the background" if asynchronous else "saved"
    print(f"checkpoint at step {step} {how}: training held {blocked:.3f} s", flush=True)
    return blocked


class Preemption(BetweenExecutions):
    """SIGTERM (a Spot or preemptible VM being reclaimed) or a preemption/maintenance notice from the
    metadata server: a checkpoint at the next boundary, then training stops; the report says
    why, the trainer raises `Preempted` and the command exits with status 143. The checkpoint is
    written synchronously, after any save still being written in the background: it is whole
    before the process exits.

    The signal handler and the watcher thread only set `reason`; everything else happens here,
    between executions. `watching()` installs both for the duration of fit.
    """

    def __init__(self, initial_step: int, manager: tf.train.CheckpointManager, poll_seconds: float, report: Report):
        super().__init__(initial_step)
        self.manager, self.poll_seconds, self.report = manager, poll_seconds, report
        self.reason = ""

    def request_stop(self, signum, frame) -> None:  # the signal handler: only a flag
        self.reason = "SIGTERM"

    def notice(self, reason: str) -> None:  # from the watcher's thread: only a flag
        self.reason = reason

    def watching(self):
        return _Watching(self)

    def on_execution_end(self, step, previous, logs):
        if self.reason:
            save_checkpoint(self.manager, step, self.report)
            self.report.stop_with(Stop(goodput.PREEMPTED, self.reason))
            self.model.stop_training = True


class _Watching:
    """The SIGTERM handler and the metadata watcher, installed on entry and removed on exit.

    Entered after the strategy is created: initialising a TPU (libtpu) installs signal handlers of
    its own, and a handler installed before it would be replaced."""

    def __init__(self, callback: Preemption):
        self.callback = callback

    def __enter__(self):
        self.previous_handler = signal.signal(signal.SIGTERM, self.callback.request_stop)
        self.watcher = preemption.MetadataWatcher(self.callback.notice, interval=self.callback.poll_seconds)
        self.watcher.start()
        return self.callback

    def __exit__(self, error_type, *exc):
        self.watcher.stop()
        signal.signal(signal.SIGTERM, self.previous_handler)
        callback = self.callback
        if error_type is None and callback.reason and callback.report.stop is None:
            # Asked after the last execution's boundary (while fit released its input): saved and
            # reported all the same, so the start still ends as preempted.
            save_checkpoint(callback.manager, callback.report.step, callback.report)
            callback.report.stop_with(Stop(goodput.PREEMPTED, callback.reason))
        return False


class PeriodicEvaluation(BetweenExecutions):
    """Every `train.eval_every` steps before the last: the same exactly-once evaluation as at the
    end, its metrics into Keras' `logs` as `eval_<metric>` (for the callbacks after it), into the
    report's history and TensorBoard, and the checkpoint of the best evaluation by `monitor` (an
    `eval_<metric>` name) in `mode` ('max' or 'min') kept in its own folder, which the rotation of
    keep_checkpoints never deletes. Not started once training stops."""

    def __init__(
        self,
        initial_step: int,
        every: int,
        total_steps: int,
        evaluate: Callable[[], dict],
        best_manager: tf.train.CheckpointManager,
        monitor: str,
        mode: str,
        metric_names: list[str],
        write_summaries: Callable[[dict, int], None],
        describe: Callable[[dict], str],
        report: Report,
    ):
        super().__init__(initial_step)
        self.every, self.total_steps, self.evaluate, self.best_manager = every, total_steps, evaluate, best_manager
        self.monitor, self.mode, self.metric_names = monitor, mode, metric_names
        self.write_summaries, self.describe, self.report = write_summaries, describe, report

    def on_execution_end(self, step, previous, logs):
        if self.model.stop_training or not crossed(self.every, previous, step) or step >= self.total_steps:
            return
        started = time.perf_counter()
        metrics = self.evaluate()
        best = self.report.record_evaluation(step, metrics, self.metric_names, self.monitor, self.mode)
        self.write_summaries(metrics, step)
        if best:
            self.best_manager.save(checkpoint_number=step)
        logs.update({f"eval_{name}": metrics[name] for name in self.metric_names})
        self.report.last_evaluation = (step, metrics)
        self.report.evaluation_seconds += time.perf_counter() - started
        print(f"eval at step {step}: {self.describe(metrics)}{'  (best so far)' if best else ''}", flush=True)
        self.model.reset_metrics()  # evaluate() shares the compiled metrics with training


class EarlyStopping(BetweenExecutions):
    """Stops training after `patience` evaluations in a row whose `monitor` (an `eval_<metric>` in
    the logs) did not improve on the best so far by more than `min_delta` in `mode` ('max' or 'min'),
    as Keras' EarlyStopping does per epoch. `history` holds the run's earlier evaluations: a resumed
    run counts on from where it stopped. The stop is reported; the run then finishes as usual (final
    checkpoint, evaluation, export) and records that it stopped early."""

    def __init__(self, initial_step: int, monitor: str, mode: str, patience: int, min_delta: float, history, report):
        super().__init__(initial_step)
        self.monitor, self.mode, self.patience, self.min_delta, self.report = monitor, mode, patience, min_delta, report
        self.best, self.waited = None, 0
        for entry in history:
            self.observe(entry[metric_of(monitor)])

    def observe(self, value: float) -> None:
        better = self.best is None or (
            value > self.best + self.min_delta if self.mode == "max" else value < self.best - self.min_delta
        )
        self.best, self.waited = (value, 0) if better else (self.best, self.waited + 1)

    def on_execution_end(self, step, previous, logs):
        if self.monitor not in logs or self.model.stop_training:
            return
        self.observe(float(logs[self.monitor]))
        if self.waited >= self.patience:
            self.report.stop_with(
                Stop(
                    goodput.STOPPED_EARLY,
                    f"{self.monitor} did not improve on {self.best:.4f} by more than {self.min_delta:g} in "
                    f"{self.waited} evaluations (train.early_stop_patience={self.patience})",
                )
            )
            print(f"stopping early at step {step}: {self.report.stop.detail}", flush=True)
            self.model.stop_training = True


def metric_of(monitor: str) -> str:
    """The metric an `eval_<metric>` monitor names, as the history keys it."""
    return monitor.removeprefix("eval_")


def record_evaluation(history: list[dict], step: int, metrics: dict, names: list[str], monitor: str, mode: str) -> bool:
    """Adds an evaluation to `history` (a rerun's evaluation of the same step replaces it); whether it
    is the best one by `monitor` in `mode`."""
    entry = {"step": step, **{name: metrics[name] for name in names}}
    history[:] = [*(kept for kept in history if kept["step"] != step), entry]
    return best_evaluation(history, monitor, mode)["step"] == step


def best_evaluation(history: list[dict], monitor: str, mode: str) -> dict:
    """The evaluation with the best `monitor`, highest or lowest by `mode` (the earliest among equals)."""
    choose = max if mode == "max" else min
    return choose(history, key=lambda entry: entry[metric_of(monitor)])


def evaluation_summary(history: list[dict], monitor: str, mode: str) -> dict:
    """`best_<metric>`, `best_step` and the history, for the run record ({} without evaluations)."""
    if not history:
        return {}
    best, metric = best_evaluation(history, monitor, mode), metric_of(monitor)
    return {f"best_{metric}": best[metric], "best_step": best["step"], "history": history}
