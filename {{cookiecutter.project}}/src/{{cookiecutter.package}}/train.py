"""Training: strategy -> input -> model -> fit with checkpoints, logs and profiling -> evaluation.

    python -m {{ cookiecutter.package }}.train --config configs/local.yaml [dotted.key=value ...]

A run lives in `runtime.output_dir`: config.yaml (the resolved config), checkpoints/, logs/
(TensorBoard: train, eval, profiles), metrics.json, and export/ (a SavedModel for serving).
Running the same command again resumes from the latest checkpoint. SIGTERM (a spot or
preemptible TPU VM being reclaimed, maintenance) saves a checkpoint and exits with status 143
within one execution of `steps_per_execution` steps; a NaN loss stops the run without saving.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from typing import Sequence

import tensorflow as tf

from . import config as config_lib
from . import distribute, input_pipeline, schedule
from . import steps_per_execution as spe_lib
from .evaluate import evaluate_model, run_path, write_eval_summaries, write_metrics
from .errors import UserError, run_cli
from .keras import keras
from .model import build_model, compile_model, set_precision

PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM


class TrainingMonitor(keras.callbacks.Callback):
    """Everything that happens between executions: logs, checkpoints, profiling, SIGTERM, NaN.

    Keras calls back once per execution (every `steps_per_execution` steps), so each action
    happens at the first execution boundary at or after its step.
    """

    def __init__(self, cfg: config_lib.Config, manager: tf.train.CheckpointManager, writer, initial_step: int):
        super().__init__()
        self.cfg, self.manager, self.writer = cfg, manager, writer
        self.peak = schedule.scaled_learning_rate(cfg.train.base_learning_rate, cfg.train.global_batch_size,
                                                  cfg.train.base_batch_size)
        self.step = self.last_log_step = self.first_timed_step = initial_step
        self.last_log_time = self.first_timed_time = None
        self.profile_window = cfg.profile_window()
        self.profiling = False
        self.end_time = time.perf_counter()
        self.preempted = False
        self.nan_step = None

    def request_stop(self, signum, frame) -> None:  # signal handler: only set a flag
        self.preempted = True

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        previous, self.step = self.step, step
        now = time.perf_counter()
        if self.first_timed_time is None:  # the first execution includes tracing and compilation
            self.first_timed_step, self.first_timed_time = step, now
            self.last_log_step, self.last_log_time = step, now
        loss = float(logs["loss"])
        if not math.isfinite(loss):
            self.nan_step = step
            self.model.stop_training = True
            return
        self._write_step_summaries(previous, step, logs)
        if step // self.cfg.train.log_every > previous // self.cfg.train.log_every or step == self.cfg.train.total_steps:
            self._log(step, logs, now)
        self._profile(step)
        if step // self.cfg.train.checkpoint_every > previous // self.cfg.train.checkpoint_every or self.preempted:
            self.manager.save(checkpoint_number=step)
        if self.preempted:
            self.model.stop_training = True

    def _write_step_summaries(self, previous: int, step: int, logs: dict) -> None:
        with self.writer.as_default():
            # The schedule is a pure function of the step, so the rate of every step in the
            # execution is logged, not only the last one.
            for each in range(previous + 1, step + 1):
                tf.summary.scalar("learning_rate", schedule.learning_rate_at(
                    each, self.peak, self.cfg.train.warmup_steps, self.cfg.train.total_steps), step=each)
            tf.summary.scalar("loss", logs["loss"], step=step)
            tf.summary.scalar("accuracy", logs["accuracy"], step=step)

    def _log(self, step: int, logs: dict, now: float) -> None:
        steps = step - self.last_log_step
        rate = steps / (now - self.last_log_time) if steps and now > self.last_log_time else float("nan")
        examples = rate * self.cfg.train.global_batch_size
        self.last_log_step, self.last_log_time = step, now
        lr = schedule.learning_rate_at(step, self.peak, self.cfg.train.warmup_steps, self.cfg.train.total_steps)
        print(f"step {step:6d}/{self.cfg.train.total_steps}  loss {logs['loss']:.4f}  accuracy {logs['accuracy']:.4f}  "
              f"lr {lr:.5f}  {rate:7.2f} steps/s  {examples:9.1f} examples/s", flush=True)
        if math.isfinite(rate):
            with self.writer.as_default():
                tf.summary.scalar("steps_per_second", rate, step=step)
                tf.summary.scalar("examples_per_second", examples, step=step)
        self.writer.flush()
        # Keras reports running means since fit() started (one long epoch here): restart them so that
        # each logged loss and accuracy covers the last log_every steps only.
        self.model.reset_metrics()

    def _profile(self, step: int) -> None:
        if not self.profile_window:
            return
        start, stop = self.profile_window
        if not self.profiling and start <= step < stop:
            tf.profiler.experimental.start(run_path(self.cfg.runtime.output_dir, "logs"))
            self.profiling = True
            print(f"profiling from step {step}", flush=True)
        elif self.profiling and step >= stop:
            self.stop_profiling()

    def stop_profiling(self) -> None:
        if self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False
            print(f"profile written to {run_path(self.cfg.runtime.output_dir, 'logs', 'plugins', 'profile')}",
                  flush=True)

    def on_train_end(self, logs=None):
        self.end_time = time.perf_counter()

    def examples_per_second(self) -> float:
        """Training throughput after the first (compiling) execution."""
        elapsed = self.end_time - (self.first_timed_time or self.end_time)
        steps = self.step - self.first_timed_step
        return steps * self.cfg.train.global_batch_size / elapsed if steps and elapsed > 0 else float("nan")


def choose_steps_per_execution(cfg: config_lib.Config, resolved: distribute.Resolved, manifest: dict):
    """(`train.steps_per_execution`, the measurements): measured when it is `auto`."""
    if cfg.train.steps_per_execution != "auto":
        return int(cfg.train.steps_per_execution), []
    limit = max(1, min(cfg.train.log_every, cfg.train.checkpoint_every, cfg.train.total_steps))

    def build():
        with resolved.strategy.scope():
            return compile_model(build_model(cfg.model, manifest["image_size"], manifest["num_classes"]), cfg.train, 1)

    def iterator():
        dataset, _ = input_pipeline.distributed_dataset(
            resolved.strategy, cfg.data.dir, manifest, "train", cfg.train.global_batch_size, training=True,
            seed=cfg.runtime.seed, shuffle_buffer=cfg.data.shuffle_buffer)
        return iter(dataset)

    print(f"calibrating steps_per_execution (candidates up to {limit}):", flush=True)
    chosen, measurements = spe_lib.calibrate(build, iterator, limit)
    for m in measurements:
        mark = "  <- chosen" if m is chosen else ""
        print(f"  steps_per_execution {m.steps_per_execution:4d}: {m.steps_per_second:8.2f} steps/s{mark}", flush=True)
    return chosen.steps_per_execution, measurements


def train(cfg: config_lib.Config) -> dict:
    """Runs (or resumes) training and the final evaluation; returns the metrics."""
    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(cfg.data.dir, cfg.data.image_size)
    per_replica = resolved.per_replica_batch_size(cfg.train.global_batch_size)
    set_precision(cfg.runtime.mixed_precision)
    keras.utils.set_random_seed(cfg.runtime.seed)
    output_dir = cfg.runtime.output_dir
    tf.io.gfile.makedirs(output_dir)
    peak = schedule.scaled_learning_rate(cfg.train.base_learning_rate, cfg.train.global_batch_size,
                                         cfg.train.base_batch_size)
    print(f"data: {manifest['splits']['train']['num_examples']} train / {manifest['splits']['eval']['num_examples']} "
          f"eval examples, {manifest['num_classes']} classes, {manifest['image_size']}px; global batch "
          f"{cfg.train.global_batch_size} = {per_replica} per replica x {resolved.replicas}; learning rate "
          f"{peak:g} (= {cfg.train.base_learning_rate:g} x {cfg.train.global_batch_size}/{cfg.train.base_batch_size}),"
          f" warm-up {cfg.train.warmup_steps} steps; precision {cfg.runtime.mixed_precision}", flush=True)

    # Checkpoints are numbered by step. A finished run is only evaluated again: no calibration, and
    # its config.yaml keeps describing the training that produced it.
    latest = tf.train.latest_checkpoint(run_path(output_dir, "checkpoints"))
    if latest is not None and int(latest.rsplit("-", 1)[1]) >= cfg.train.total_steps:
        if cfg.train.steps_per_execution == "auto":
            cfg.train.steps_per_execution = 1
    else:
        cfg.train.steps_per_execution, _ = choose_steps_per_execution(cfg, resolved, manifest)
        with tf.io.gfile.GFile(run_path(output_dir, "config.yaml"), "w") as handle:
            handle.write(config_lib.dump(cfg))

    with resolved.strategy.scope():
        model = compile_model(build_model(cfg.model, manifest["image_size"], manifest["num_classes"]),
                              cfg.train, cfg.train.steps_per_execution)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, run_path(output_dir, "checkpoints"),
                                         max_to_keep=cfg.train.keep_checkpoints)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint)
    initial_step = int(model.optimizer.iterations.numpy())
    print(f"resumed from step {initial_step}" if initial_step else "starting from step 0", flush=True)
    print(f"steps_per_execution {cfg.train.steps_per_execution}; checkpoints every {cfg.train.checkpoint_every} "
          f"steps to {manager.directory}", flush=True)

    if cfg.runtime.profiler_port:
        tf.profiler.experimental.server.start(cfg.runtime.profiler_port)
        print(f"profiler server on port {cfg.runtime.profiler_port}: `make profile` captures a trace", flush=True)

    writer = tf.summary.create_file_writer(run_path(output_dir, "logs", "train"))
    monitor = TrainingMonitor(cfg, manager, writer, initial_step)
    previous_handler = signal.signal(signal.SIGTERM, monitor.request_stop)
    try:
        remaining = cfg.train.total_steps - initial_step
        if remaining > 0:
            # A new seed per start, so a resumed run does not replay the batches it already saw.
            dataset, _ = input_pipeline.distributed_dataset(
                resolved.strategy, cfg.data.dir, manifest, "train", cfg.train.global_batch_size, training=True,
                seed=cfg.runtime.seed + initial_step, shuffle_buffer=cfg.data.shuffle_buffer)
            model.fit(dataset, epochs=1, steps_per_epoch=remaining, callbacks=[monitor], verbose=0)
    finally:
        monitor.stop_profiling()
        signal.signal(signal.SIGTERM, previous_handler)
        writer.flush()

    step = monitor.step
    if monitor.nan_step is not None:
        kept = manager.latest_checkpoint or "none"
        raise UserError(f"the loss became NaN at step {monitor.nan_step}; stopped without saving (last good "
                        f"checkpoint: {kept}); lower train.base_learning_rate or check the data")
    if monitor.preempted:
        print(f"preempted (SIGTERM) at step {step}: checkpoint saved to {manager.latest_checkpoint}; "
              "run the same command again to resume", flush=True)
        sys.exit(PREEMPTED_EXIT_STATUS)
    if manager.latest_checkpoint is None or int(manager.latest_checkpoint.rsplit("-", 1)[-1]) != step:
        manager.save(checkpoint_number=step)

    metrics = evaluate_model(model, resolved.strategy, cfg, manifest)
    metrics.update(global_step=step, examples_per_second=monitor.examples_per_second())
    write_metrics(output_dir, metrics)
    write_eval_summaries(output_dir, metrics, step)
    export_dir = export(model, output_dir)
    print(f"eval accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f} at step {step}; "
          f"training {metrics['examples_per_second']:.1f} examples/s; metrics -> {run_path(output_dir, 'metrics.json')}; "
          f"SavedModel -> {export_dir}", flush=True)
    return metrics


def export(model: keras.Model, output_dir: str) -> str:
    """A SavedModel whose serving signature takes uint8 images and returns class probabilities."""
    image_shape = model.input_shape[1:]

    @tf.function(input_signature=[tf.TensorSpec([None, *image_shape], tf.uint8, name="image")])
    def serve(image):
        logits = model(image, training=False)
        return {"probabilities": tf.nn.softmax(tf.cast(logits, tf.float32)),
                "class": tf.argmax(logits, axis=-1, output_type=tf.int32)}

    path = run_path(output_dir, "export")
    options = tf.saved_model.SaveOptions(experimental_io_device="/job:localhost")
    tf.saved_model.save(model, path, signatures={"serving_default": serve}, options=options)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    cfg, _ = config_lib.command_line(__doc__.split("\n\n")[0], argv)
    train(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
