"""What happens between executions of the training step, one Keras callback per concern.

Keras calls back once per execution (every `steps_per_execution` steps), so each action happens at
the first execution boundary at or after its step. The trainer composes them in one list, in this
order (trainer.py, `Trainer.callbacks`):

    FirstExecution      books the first execution (tracing, compilation) apart from training
    NanGuard            a non-finite loss stops the run without saving
    StepLog             the log line, TensorBoard scalars, the learning rate of every step
    GoodputProgress     this start's progress in the run record, so a kill leaves it
    ProfileWindow       traces runtime.profile_steps
    Checkpoints         a checkpoint every train.checkpoint_every steps
    Preemption          SIGTERM or a metadata notice: a checkpoint now, then stop
    PeriodicEvaluation  every train.eval_every steps; the best one's checkpoint is kept apart

Another concern (an early stop, a metric upload) is another subclass of `BetweenExecutions` added
to that list; none of these needs to know about it.
"""

from __future__ import annotations

import math
import signal
import time
from typing import Callable

import tensorflow as tf

from . import goodput, preemption, schedule
from .. import tasks
from .errors import UserError
from .keras import keras
from .run_dir import checkpoint_step, run_path


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
    """Ends the clock's first-execution phase at the first boundary and prints the time to first
    step; keeps what the training throughput is measured from (the first execution excluded)."""

    def __init__(self, initial_step: int, clock: goodput.PhaseClock):
        super().__init__(initial_step)
        self.clock = clock
        self.first_step, self.first_time = initial_step, None
        self.end_time = time.perf_counter()

    def on_execution_end(self, step, previous, logs):
        if self.first_time is None:
            self.first_step, self.first_time = step, time.perf_counter()
            self.clock.start(goodput.TRAINING)
            print(self.clock.describe_first_step(), flush=True)

    def on_train_end(self, logs=None):
        self.end_time = time.perf_counter()

    def examples_per_second(self, batch_size: int, excluded_seconds: float = 0.0) -> float:
        """Training throughput after the first execution, `excluded_seconds` (evaluations) left out;
        NaN when no step was timed."""
        elapsed = self.end_time - (self.first_time or self.end_time) - excluded_seconds
        steps = self.step - self.first_step
        return steps * batch_size / elapsed if steps and elapsed > 0 else float("nan")


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
            kept = self.manager.latest_checkpoint or "none"
            raise NonFiniteLoss(
                f"the loss became NaN at step {step}; stopped without saving (last good checkpoint: {kept}); "
                "lower train.base_learning_rate or check the data"
            )


class StepLog(BetweenExecutions):
    """Every `train.log_every` steps (and at the last): one line with the loss, the task's metrics,
    the learning rate and the throughput; the same in TensorBoard. Metrics are reset after each
    line, so each covers the steps since the one before (Keras would report means since fit began)."""

    def __init__(self, initial_step: int, cfg, writer, metric_names: list[str], utilisation: Callable[[], object]):
        super().__init__(initial_step)
        self.cfg, self.writer, self.metric_names = cfg, writer, metric_names
        self.peak = schedule.scaled_learning_rate(
            cfg.train.base_learning_rate, cfg.effective_batch_size, cfg.train.base_batch_size
        )
        self.last_step, self.last_time = initial_step, None
        # The model FLOPs are counted after the first execution (tracing the model takes a moment,
        # kept out of the time to first step and out of the timed windows).
        self.make_utilisation, self.utilisation = utilisation, None

    def learning_rate(self, step: int) -> float:
        return schedule.learning_rate_at(step, self.peak, self.cfg.train.warmup_steps, self.cfg.train.total_steps)

    def on_execution_end(self, step, previous, logs):
        now = time.perf_counter()
        if self.last_time is None:  # the first execution (compilation) is not timed
            self.utilisation = self.make_utilisation()
            print(self.utilisation.describe(), flush=True)
            now = time.perf_counter()
            self.last_step, self.last_time = step, now
        with self.writer.as_default():
            # The schedule is a pure function of the step: every step's rate is logged, not only the last.
            for each in range(previous + 1, step + 1):
                tf.summary.scalar("learning_rate", self.learning_rate(each), step=each)
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
            f"{rate:7.2f} steps/s  {examples:9.1f} examples/s  {tflops:7.3f} TFLOP/s/chip"
            + (f"  MFU {mfu:6.1%}" if mfu is not None else ""),
            flush=True,
        )
        if math.isfinite(rate):
            with self.writer.as_default():
                tf.summary.scalar("steps_per_second", rate, step=step)
                tf.summary.scalar("examples_per_second", examples, step=step)
                tf.summary.scalar("tflops_per_chip", tflops, step=step)
                if mfu is not None:
                    tf.summary.scalar("model_flops_utilization", mfu, step=step)
        self.writer.flush()
        self.model.reset_metrics()


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
    """A checkpoint at every `train.checkpoint_every` boundary; `save` times each one (the time a
    preemption notice must leave for it)."""

    def __init__(self, initial_step: int, manager: tf.train.CheckpointManager, checkpoint_every: int):
        super().__init__(initial_step)
        self.manager, self.checkpoint_every = manager, checkpoint_every
        self.save_seconds: list[float] = []

    def on_execution_end(self, step, previous, logs):
        if crossed(self.checkpoint_every, previous, step):
            self.save(step)

    def save(self, step: int) -> None:
        started = time.perf_counter()
        self.manager.save(checkpoint_number=step)
        self.save_seconds.append(time.perf_counter() - started)

    def saved(self, step: int) -> bool:
        latest = self.manager.latest_checkpoint
        return latest is not None and checkpoint_step(latest) == step


class Preemption(BetweenExecutions):
    """SIGTERM (a Spot or preemptible VM being reclaimed) or a preemption/maintenance notice from the
    metadata server: a checkpoint at the next boundary, then training stops; the trainer raises
    `Preempted` and the command exits with status 143.

    The signal handler and the watcher thread only set `reason`; everything else happens here,
    between executions. `watching()` installs both for the duration of fit.
    """

    def __init__(self, initial_step: int, checkpoints: Checkpoints, poll_seconds: float):
        super().__init__(initial_step)
        self.checkpoints, self.poll_seconds = checkpoints, poll_seconds
        self.reason = ""

    def request_stop(self, signum, frame) -> None:  # the signal handler: only a flag
        self.reason = "SIGTERM"

    def notice(self, reason: str) -> None:  # from the watcher's thread: only a flag
        self.reason = reason

    def watching(self):
        return _Watching(self)

    def on_execution_end(self, step, previous, logs):
        if self.reason:
            if not self.checkpoints.saved(step):
                self.checkpoints.save(step)
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

    def __exit__(self, *exc):
        self.watcher.stop()
        signal.signal(signal.SIGTERM, self.previous_handler)
        return False


class PeriodicEvaluation(BetweenExecutions):
    """Every `train.eval_every` steps before the last: the same exactly-once evaluation as at the
    end, its metrics in the history and TensorBoard, and the best one's checkpoint kept in its own
    folder (the rotation of keep_checkpoints never deletes it). Not started once training stops."""

    def __init__(
        self,
        initial_step: int,
        cfg,
        evaluate: Callable[[], dict],
        best_manager: tf.train.CheckpointManager,
        history: list[dict],
        metric_names: list[str],
        write_summaries: Callable[[dict, int], None],
        describe: Callable[[dict], str],
    ):
        super().__init__(initial_step)
        self.every, self.total_steps = cfg.train.eval_every, cfg.train.total_steps
        self.evaluate, self.best_manager, self.history = evaluate, best_manager, history
        self.metric_names, self.write_summaries, self.describe = metric_names, write_summaries, describe
        self.seconds = 0.0

    def on_execution_end(self, step, previous, logs):
        if self.model.stop_training or not crossed(self.every, previous, step) or step >= self.total_steps:
            return
        started = time.perf_counter()
        metrics = self.evaluate()
        self.record(step, metrics)
        self.seconds += time.perf_counter() - started
        best = "  (best so far)" if self.best()["step"] == step else ""
        print(f"eval at step {step}: {self.describe(metrics)}{best}", flush=True)
        self.model.reset_metrics()  # evaluate() shares the compiled metrics with training

    def record(self, step: int, metrics: dict) -> None:
        """Adds an evaluation to the history (a rerun's evaluation of the same step replaces it)."""
        entry = {"step": step, **{name: metrics[name] for name in self.metric_names}}
        self.history[:] = [*(kept for kept in self.history if kept["step"] != step), entry]
        self.write_summaries(metrics, step)
        if self.best()["step"] == step:
            self.best_manager.save(checkpoint_number=step)

    def best(self) -> dict:
        """The evaluation with the best headline metric, highest or lowest as the task says (the
        earliest among equals)."""
        task = tasks.current()
        choose = max if task.higher_is_better else min
        return choose(self.history, key=lambda entry: entry[task.headline_metric])

    def summary(self) -> dict:
        """`best_<headline>`, `best_step` and the history, for the run record."""
        best, headline = self.best(), tasks.current().headline_metric
        return {f"best_{headline}": best[headline], "best_step": best["step"], "history": self.history}
