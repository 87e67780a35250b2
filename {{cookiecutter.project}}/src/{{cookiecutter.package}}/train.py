"""Training: strategy -> input -> model -> fit with checkpoints, logs and profiling -> evaluation.

    python -m {{ cookiecutter.package }}.train --config configs/local.yaml [dotted.key=value ...]

A run lives in `runtime.output_dir`: config.yaml (the resolved config), checkpoints/, logs/
(TensorBoard: train, eval, profiles), metrics.json, and export/ (a SavedModel for serving).
Running the same command again resumes from the latest checkpoint. SIGTERM (a spot or
preemptible TPU VM being reclaimed, maintenance) saves a checkpoint and exits with status 143
within one execution of `steps_per_execution` steps; a NaN loss stops the run without saving.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from typing import Sequence

import tensorflow as tf

from . import config as config_lib
from . import capture_profile, distribute, goodput, input_pipeline, precision, preemption, schedule, tasks
from . import steps_per_execution as spe_lib
from .errors import UserError, run_cli
from .evaluate import describe, evaluate_model, run_path, write_eval_summaries, write_metrics
from .keras import keras
from .topology import Target
from .model import build_model, compile_model, metric_names

PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM


class TrainingMonitor(keras.callbacks.Callback):
    """Everything that happens between executions: logs, checkpoints, profiling, SIGTERM, NaN.

    Keras calls back once per execution (every `steps_per_execution` steps), so each action
    happens at the first execution boundary at or after its step.
    """

    def __init__(
        self,
        cfg: config_lib.Config,
        manager: tf.train.CheckpointManager,
        writer,
        initial_step: int,
        evaluate=None,
        best_manager: tf.train.CheckpointManager | None = None,
        clock: PhaseClock | None = None,
        progress=None,
    ):
        super().__init__()
        self.cfg, self.manager, self.writer = cfg, manager, writer
        # The clock books the first execution (tracing, compilation) apart from training; `progress`
        # is called with the step at every log line, so a start killed without notice leaves it.
        self.clock, self.progress = clock, progress
        self.evaluate, self.best_manager = evaluate, best_manager
        self.history: list[dict] = []
        self.eval_seconds = 0.0
        self.save_seconds: list[float] = []
        self.stop_reason = ""
        self.peak = schedule.scaled_learning_rate(
            cfg.train.base_learning_rate, cfg.effective_batch_size, cfg.train.base_batch_size
        )
        self.step = self.last_log_step = self.first_timed_step = initial_step
        self.last_log_time = self.first_timed_time = None
        self.profile_window = cfg.profile_window()
        self.profiling = False
        self.end_time = time.perf_counter()
        self.preempted = False
        self.nan_step = None

    def request_stop(self, signum, frame) -> None:  # signal handler: only set a flag
        self.preempted, self.stop_reason = True, "SIGTERM"

    def notice(self, reason: str) -> None:  # from the metadata watcher's thread: only set a flag
        self.preempted, self.stop_reason = True, reason

    def save(self, step: int) -> None:
        started = time.perf_counter()
        self.manager.save(checkpoint_number=step)
        self.save_seconds.append(time.perf_counter() - started)

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        previous, self.step = self.step, step
        now = time.perf_counter()
        if self.first_timed_time is None:  # the first execution includes tracing and compilation
            self.first_timed_step, self.first_timed_time = step, now
            self.last_log_step, self.last_log_time = step, now
            if self.clock is not None:
                self.clock.start("training")
                print(self.clock.describe_first_step(), flush=True)
        loss = float(logs["loss"])
        if not math.isfinite(loss):
            self.nan_step = step
            self.model.stop_training = True
            return
        self._write_step_summaries(previous, step, logs)
        if (
            step // self.cfg.train.log_every > previous // self.cfg.train.log_every
            or step == self.cfg.train.total_steps
        ):
            self._log(step, logs, now)
        self._profile(step)
        if step // self.cfg.train.checkpoint_every > previous // self.cfg.train.checkpoint_every or self.preempted:
            self.save(step)
        if self.preempted:
            self.model.stop_training = True
            return
        every = self.cfg.train.eval_every
        if every and step // every > previous // every and step < self.cfg.train.total_steps:
            self.periodic_evaluation(step)

    def periodic_evaluation(self, step: int) -> None:
        """The same exactly-once evaluation as at the end; the best one's checkpoint is kept apart
        from the rotation of keep_checkpoints."""
        started = time.perf_counter()
        metrics = self.evaluate()
        self.record_evaluation(step, metrics)
        self.eval_seconds += time.perf_counter() - started
        print(
            f"eval at step {step}: {describe(metrics)}{'  (best so far)' if self.best()['step'] == step else ''}",
            flush=True,
        )
        self.model.reset_metrics()  # evaluate() shares the compiled metrics with training

    def record_evaluation(self, step: int, metrics: dict) -> None:
        # A rerun of a finished run evaluates its last step again: that entry is replaced, not repeated.
        entry = {"step": step, **{name: metrics[name] for name in metric_names()}}
        self.history = [*(kept for kept in self.history if kept["step"] != step), entry]
        write_eval_summaries(self.cfg.runtime.output_dir, metrics, step)
        if self.best_manager is not None and self.best()["step"] == step:
            self.best_manager.save(checkpoint_number=step)

    def best(self) -> dict:
        """The evaluation with the best headline metric, highest or lowest as the task says (the
        earliest among equals)."""
        task = tasks.current()
        choose = max if task.higher_is_better else min
        return choose(self.history, key=lambda entry: entry[task.headline_metric])

    def _write_step_summaries(self, previous: int, step: int, logs: dict) -> None:
        with self.writer.as_default():
            # The schedule is a pure function of the step, so the rate of every step in the
            # execution is logged, not only the last one.
            for each in range(previous + 1, step + 1):
                tf.summary.scalar(
                    "learning_rate",
                    schedule.learning_rate_at(each, self.peak, self.cfg.train.warmup_steps, self.cfg.train.total_steps),
                    step=each,
                )
            for name in metric_names():
                tf.summary.scalar(name, logs[name], step=step)

    def _log(self, step: int, logs: dict, now: float) -> None:
        steps = step - self.last_log_step
        rate = steps / (now - self.last_log_time) if steps and now > self.last_log_time else float("nan")
        examples = rate * self.cfg.effective_batch_size
        self.last_log_step, self.last_log_time = step, now
        lr = schedule.learning_rate_at(step, self.peak, self.cfg.train.warmup_steps, self.cfg.train.total_steps)
        values = "  ".join(f"{name} {logs[name]:.4f}" for name in metric_names())
        print(
            f"step {step:6d}/{self.cfg.train.total_steps}  {values}  "
            f"lr {lr:.5f}  {rate:7.2f} steps/s  {examples:9.1f} examples/s",
            flush=True,
        )
        if math.isfinite(rate):
            with self.writer.as_default():
                tf.summary.scalar("steps_per_second", rate, step=step)
                tf.summary.scalar("examples_per_second", examples, step=step)
        self.writer.flush()
        if self.progress is not None:
            self.progress(step)
        # Keras reports running means since fit() started (one long epoch here): restart them so that
        # each logged loss and metric covers the last log_every steps only.
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
            print(
                f"profile written to {run_path(self.cfg.runtime.output_dir, 'logs', 'plugins', 'profile')}", flush=True
            )

    def on_train_end(self, logs=None):
        self.end_time = time.perf_counter()

    def examples_per_second(self) -> float:
        """Training throughput after the first (compiling) execution, periodic evaluations excluded."""
        elapsed = self.end_time - (self.first_timed_time or self.end_time) - self.eval_seconds
        steps = self.step - self.first_timed_step
        return steps * self.cfg.effective_batch_size / elapsed if steps and elapsed > 0 else float("nan")


def training_dataset(cfg: config_lib.Config, resolved: Target, manifest: dict, seed: int):
    """The train split, repeated and shuffled with `seed`, distributed over the replicas."""
    dataset, _ = input_pipeline.distributed_dataset(
        resolved.strategy,
        cfg.data.dir,
        manifest,
        "train",
        cfg.train.global_batch_size,
        training=True,
        seed=seed,
        shuffle_buffer=cfg.data.shuffle_buffer,
        accumulation_steps=cfg.train.gradient_accumulation_steps,
    )
    return dataset


def profiler_port_is_free(port: int) -> bool:
    """Whether the profiler server can have `port` to itself: nothing listens there, and its gRPC
    server can bind it on every address (IPv6 and IPv4, with the port reuse gRPC asks for)."""
    import socket

    if (
        capture_profile.connection_error("127.0.0.1", port) is None
    ):  # a server answers: gRPC would share the port with it
        return False
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = ("::", port)
    except OSError:  # no IPv6 on this host
        probe, address = socket.socket(socket.AF_INET), ("0.0.0.0", port)
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind(address)
        except OSError:
            return False
    return True


def start_profiler_server(port: int) -> bool:
    """Starts the server `make profile` captures from. On a port something else holds, TensorFlow
    would only log that it cannot bind: this says so, and the run trains on without the server."""
    if not profiler_port_is_free(port):
        print(
            f"warning: profiler port {port} is in use (another training job on this machine?): this run has "
            "no profiler server; set runtime.profiler_port to a free port for `make profile`, or 0 for none",
            flush=True,
        )
        return False
    tf.profiler.experimental.server.start(port)
    print(f"profiler server on port {port}: `make profile` captures a trace", flush=True)
    return True


def start_seed(cfg: config_lib.Config, initial_step: int) -> int:
    """The training input's seed for a start at `initial_step`: a new one per start, so a resumed run
    reads the train split in another order and does not replay the batches it began with."""
    return cfg.runtime.seed + initial_step


def choose_steps_per_execution(cfg: config_lib.Config, resolved: Target, manifest: dict):
    """(`train.steps_per_execution`, the measurements): measured on a model of its own when it is
    `auto` (benchmarks and tests; a run calibrates the model it trains, in `train`)."""
    if not config_lib.is_auto(cfg.train.steps_per_execution):
        return int(cfg.train.steps_per_execution), []
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg, manifest), cfg.train, max(2, spe_lib.limit(cfg.train)))
    dataset = training_dataset(cfg, resolved, manifest, seed=cfg.runtime.seed)
    chosen, measurements = calibrate(cfg, model, iter(dataset))
    return chosen.steps_per_execution, measurements


def calibrate(cfg: config_lib.Config, model: keras.Model, iterator, train_function=None):
    """Measures the candidates on `model` (compiled with steps_per_execution > 1; `train_function`
    from spe_lib.loop_function, if already compiled) and prints why it chose what it chose;
    returns (chosen, measurements)."""
    limit = spe_lib.limit(cfg.train)
    print(
        f"calibrating steps_per_execution (candidates up to {limit}, median of {spe_lib.ROUNDS} rounds each):",
        flush=True,
    )
    chosen, measurements = spe_lib.calibrate(
        model,
        iterator,
        limit,
        max_seconds_per_execution=cfg.train.max_seconds_per_execution,
        train_function=train_function,
    )
    best = max(m.steps_per_second for m in measurements)
    for m in measurements:
        mark = "  <- chosen" if m is chosen else ""
        rounds = ", ".join(f"{rate:.2f}" for rate in m.rounds)
        print(
            f"  steps_per_execution {m.steps_per_execution:4d}: {m.steps_per_second:8.2f} steps/s "
            f"(rounds {rounds}){mark}",
            flush=True,
        )
    print(
        f"  chose {chosen.steps_per_execution}: the largest within {spe_lib.TOLERANCE:.0%} of the fastest "
        f"({best:.2f} steps/s)",
        flush=True,
    )
    skipped = [value for value in spe_lib.candidates(limit) if value > measurements[-1].steps_per_execution]
    if skipped:
        print(
            f"  not tried: {', '.join(map(str, skipped))} (one execution would exceed "
            f"train.max_seconds_per_execution={cfg.train.max_seconds_per_execution:g} s)",
            flush=True,
        )
    return chosen, measurements


def stored_calibration(cfg: config_lib.Config, key: dict, run_metrics: dict) -> tuple[dict | None, str]:
    """(the stored choice for this setting, where it was found): the run's own metrics.json first
    (a resume), then the cache (a rerun, or a new run with the same setting)."""
    if cfg.train.steps_per_execution == spe_lib.FRESH:
        return None, ""
    own = run_metrics.get("calibration")
    if isinstance(own, dict) and own.get("setting") == key:
        return own, "this run's metrics.json"
    path = spe_lib.cache_path(spe_lib.cache_dir(cfg.runtime.cache_dir), key)
    cached = spe_lib.read_cache(path, key)
    return cached, (f"the cache {path}" if cached else "")


def restore_newest_readable(checkpoint: tf.train.Checkpoint, manager: tf.train.CheckpointManager) -> str | None:
    """Restores the newest checkpoint that can be read; returns its path, or None for a fresh start.

    A save cut short (the VM stopped mid-write, a truncated file on a full disk) leaves a newest
    checkpoint that cannot be read: that is not fatal, the one before it is used, and the log says so.
    """
    for path in reversed(manager.checkpoints):
        try:
            checkpoint.restore(path).assert_existing_objects_matched()
            return path
        except Exception as error:  # noqa: BLE001 - a cut-short file fails in many ways (OpError, IndexError, ...)
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
            print(
                f"checkpoint {path} cannot be read ({type(error).__name__}: {detail}); trying the one before",
                flush=True,
            )
    if manager.checkpoints:
        raise UserError(
            f"no checkpoint in {manager.directory} can be read; move the folder away to start afresh, "
            "or set runtime.output_dir to a new run directory"
        )
    return None


class PhaseClock:
    """Wall-clock seconds of each phase of a run, printed at the end so that a stall shows in any log."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.current, self.started = "start-up", time.perf_counter()

    def start(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self.started
        self.current, self.started = phase, now

    def move(self, seconds: float, source: str, destination: str) -> None:
        """Re-books time measured inside one phase (periodic evaluation inside training)."""
        self.seconds[source] = self.seconds.get(source, 0.0) - seconds
        self.seconds[destination] = self.seconds.get(destination, 0.0) + seconds

    def so_far(self) -> dict[str, float]:
        """The seconds of each phase, the current one up to now."""
        seconds = dict(self.seconds)
        seconds[self.current] = seconds.get(self.current, 0.0) + time.perf_counter() - self.started
        return {name: round(value, 2) for name, value in seconds.items() if name != "done"}

    def describe_first_step(self) -> str:
        parts = {name: self.seconds[name] for name in goodput.BEFORE_FIRST_STEP if self.seconds.get(name)}
        return f"time to first step {sum(parts.values()):.1f} s: " + ", ".join(
            f"{name} {seconds:.1f} s" for name, seconds in parts.items()
        )

    def report(self) -> str:
        self.start("done")
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())


def train(cfg: config_lib.Config) -> dict:
    """Runs (or resumes) training and the final evaluation; returns the metrics."""
    clock = PhaseClock()
    clock.start("strategy")
    resolved = distribute.resolve(cfg.runtime)
    clock.start("data check")
    manifest = input_pipeline.read_manifest(cfg.data.dir, cfg.data)
    clock.start("start-up")
    per_replica = resolved.per_replica_batch_size(cfg.train.global_batch_size)
    # config.yaml and metrics.json record the precision that ran, not `auto`.
    chosen_precision = precision.apply(cfg.runtime.mixed_precision, resolved.kind)
    cfg.runtime.mixed_precision = chosen_precision.precision
    keras.utils.set_random_seed(cfg.runtime.seed)
    output_dir = cfg.runtime.output_dir
    tf.io.gfile.makedirs(output_dir)
    peak = schedule.scaled_learning_rate(
        cfg.train.base_learning_rate, cfg.effective_batch_size, cfg.train.base_batch_size
    )
    accumulation = cfg.train.gradient_accumulation_steps
    effective = (
        f", effective batch {cfg.effective_batch_size} (= {cfg.train.global_batch_size} x {accumulation} accumulated)"
        if accumulation > 1
        else ""
    )
    print(
        f"data: {manifest['splits']['train']['num_examples']} train / {manifest['splits']['eval']['num_examples']} "
        f"eval examples, {tasks.current().describe_data(manifest)}; global batch "
        f"{cfg.train.global_batch_size} = {per_replica} per replica x {resolved.replicas}{effective}; learning rate "
        f"{peak:g} (= {cfg.train.base_learning_rate:g} x {cfg.effective_batch_size}/{cfg.train.base_batch_size}),"
        f" warm-up {cfg.train.warmup_steps} updates; precision {chosen_precision.describe()}",
        flush=True,
    )

    # Checkpoints are numbered by step. A finished run is only evaluated again: no calibration, and
    # its config.yaml keeps describing the training that produced it.
    latest = tf.train.latest_checkpoint(run_path(output_dir, "checkpoints"))
    finished = latest is not None and int(latest.rsplit("-", 1)[1]) >= cfg.train.total_steps
    auto = config_lib.is_auto(cfg.train.steps_per_execution)
    run_metrics = read_metrics(output_dir)
    calibration, found_in = None, ""
    if auto and not finished:
        key = spe_lib.setting(cfg, resolved, cfg.runtime.mixed_precision)
        calibration, found_in = stored_calibration(cfg, key, run_metrics)
    if not auto:
        compiled_spe = int(cfg.train.steps_per_execution)
    elif finished:
        compiled_spe = 1
    elif calibration:
        compiled_spe = calibration["steps_per_execution"]
    else:  # to be measured: Keras' loop over the steps_per_execution variable, one compilation for all
        compiled_spe = max(2, spe_lib.limit(cfg.train))

    clock.start("model build")
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg, manifest), cfg.train, compiled_spe)
        # The optimizer's slots exist before the restore, so that it fills them at once: Keras would
        # otherwise create them at the first update, and a finished run (evaluated, never updated)
        # would warn about every slot value the checkpoint holds.
        model.optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(
        checkpoint, run_path(output_dir, "checkpoints"), max_to_keep=cfg.train.keep_checkpoints
    )
    # The best periodic evaluation's checkpoint, in its own folder: the rotation above never deletes it.
    best_manager = tf.train.CheckpointManager(checkpoint, run_path(output_dir, "checkpoints", "best"), max_to_keep=1)
    clock.start("restore")
    restore_newest_readable(checkpoint, manager)
    initial_step = int(model.optimizer.iterations.numpy())
    clock.start("start-up")
    print(f"resumed from step {initial_step}" if initial_step else "starting from step 0", flush=True)
    remaining = cfg.train.total_steps - initial_step
    dataset = training_dataset(cfg, resolved, manifest, seed=start_seed(cfg, initial_step)) if remaining > 0 else None

    if auto and not finished:
        if calibration:
            print(
                f"steps_per_execution {calibration['steps_per_execution']}: reusing the calibration in {found_in} "
                f"(no candidate compiled; train.steps_per_execution={spe_lib.FRESH} measures again)",
                flush=True,
            )
        else:
            with resolved.strategy.scope():
                # The candidates run on the model that is trained: its restored (or initial) state is
                # put back afterwards. Compiling the loop is booked as the first execution: training
                # reuses it, and a start that reuses a stored choice pays it in fit() instead.
                snapshot = spe_lib.Snapshot(model)
                clock.start("first execution")
                iterator = iter(dataset)
                train_function = spe_lib.loop_function(model, iterator)
                clock.start("calibration")
                chosen, measurements = calibrate(cfg, model, iterator, train_function)
                snapshot.restore()
                del iterator
            calibration = spe_lib.record(key, chosen, measurements)
            cache = spe_lib.cache_path(spe_lib.cache_dir(cfg.runtime.cache_dir), key)
            spe_lib.write_cache(cache, calibration)
            print(f"  stored in this run's metrics.json and in {cache}", flush=True)
            clock.start("start-up")
        cfg.train.steps_per_execution = calibration["steps_per_execution"]
        model.steps_per_execution.assign(cfg.train.steps_per_execution)
    elif finished and auto:
        cfg.train.steps_per_execution = 1
    if not finished:
        with tf.io.gfile.GFile(run_path(output_dir, "config.yaml"), "w") as handle:
            handle.write(config_lib.dump(cfg))
    print(
        f"steps_per_execution {cfg.train.steps_per_execution}; checkpoints every {cfg.train.checkpoint_every} "
        f"steps to {manager.directory}"
        + (f"; evaluation every {cfg.train.eval_every} steps" if cfg.train.eval_every else ""),
        flush=True,
    )

    # This start's entry in the goodput record, rewritten as it goes (see goodput.py).
    earlier_starts = run_metrics.get("goodput", {}).get("per_start", [])
    this_start = {"initial_step": initial_step, "furthest_step": initial_step, "end": "running"}

    def record_progress(step: int, end: str = "running") -> dict:
        this_start.update(furthest_step=step, phase_seconds=clock.so_far(), end=end)
        record = goodput.summarize([*earlier_starts, this_start])
        extra = {"calibration": calibration} if calibration else {}
        write_metrics(output_dir, {**read_metrics(output_dir), **extra, "goodput": record})
        return record

    if cfg.runtime.profiler_port:
        start_profiler_server(cfg.runtime.profiler_port)

    writer = tf.summary.create_file_writer(run_path(output_dir, "logs", "train"))
    monitor = TrainingMonitor(
        cfg,
        manager,
        writer,
        initial_step,
        evaluate=lambda: evaluate_model(model, resolved.strategy, cfg, manifest),
        best_manager=best_manager,
        clock=clock,
        progress=record_progress,
    )
    monitor.history = [entry for entry in read_metrics(output_dir).get("history", []) if entry["step"] <= initial_step]
    # Installed after the strategy: initialising a TPU (libtpu) installs signal handlers of its own,
    # and a handler installed before it would be replaced.
    previous_handler = signal.signal(signal.SIGTERM, monitor.request_stop)
    watcher = preemption.MetadataWatcher(monitor.notice, interval=cfg.runtime.metadata_poll_seconds)
    watcher.start()
    clock.start("first execution" if remaining > 0 else "training")
    try:
        if remaining > 0:
            model.fit(dataset, epochs=1, steps_per_epoch=remaining, callbacks=[monitor], verbose=0)
    finally:
        watcher.stop()
        monitor.stop_profiling()
        signal.signal(signal.SIGTERM, previous_handler)
        writer.flush()
    clock.move(monitor.eval_seconds, "training", "evaluation")
    if remaining > 0:
        # From the last step's callback to fit() returning: releasing the input iterators. Near 0 s;
        # the tf.data autotuning race described in input_pipeline.py made it minutes.
        clock.move(time.perf_counter() - monitor.end_time, "training", "end of fit")

    step = monitor.step
    if monitor.nan_step is not None:
        kept = manager.latest_checkpoint or "none"
        raise UserError(
            f"the loss became NaN at step {monitor.nan_step}; stopped without saving (last good "
            f"checkpoint: {kept}); lower train.base_learning_rate or check the data"
        )
    if monitor.save_seconds:
        print(
            f"checkpoint save: {max(monitor.save_seconds):.2f} s at most ({len(monitor.save_seconds)} saves)",
            flush=True,
        )
    if monitor.preempted:
        print(
            f"preempted ({monitor.stop_reason}) at step {step}: checkpoint saved to {manager.latest_checkpoint}; "
            "run the same command again to resume",
            flush=True,
        )
        if monitor.history:
            write_metrics(output_dir, {**read_metrics(output_dir), **summarize_history(monitor)})
        record = record_progress(step, end="preempted")
        print(f"timings: {clock.report()}", flush=True)
        print(goodput.describe(record, cfg.train.steps_per_execution), flush=True)
        sys.exit(PREEMPTED_EXIT_STATUS)
    if manager.latest_checkpoint is None or int(manager.latest_checkpoint.rsplit("-", 1)[-1]) != step:
        monitor.save(step)

    clock.start("evaluation")
    metrics = evaluate_model(model, resolved.strategy, cfg, manifest)
    # Written over what an earlier start wrote: a rerun of a finished run renews the evaluation, keeps
    # the rest, and keeps the run's throughput (no step trained in this start).
    previous = read_metrics(output_dir)
    throughput = monitor.examples_per_second()
    if not math.isfinite(throughput):
        throughput = previous.get("examples_per_second") or 0.0
    metrics.update(global_step=step, examples_per_second=throughput, mixed_precision=cfg.runtime.mixed_precision)
    if monitor.save_seconds:
        metrics["checkpoint_save_seconds"] = round(max(monitor.save_seconds), 3)
    if cfg.train.eval_every:
        monitor.record_evaluation(step, metrics)
        metrics.update(summarize_history(monitor))
    else:
        write_eval_summaries(output_dir, metrics, step)
    clock.start("export")
    export_dir = export(model, output_dir, manifest, cfg)
    metrics["phase_seconds"] = clock.so_far()
    metrics["time_to_first_step_seconds"] = round(goodput.time_to_first_step(metrics["phase_seconds"]), 2)
    write_metrics(output_dir, {**previous, **metrics})
    record = record_progress(step, end="finished")
    timings = clock.report()
    headline = tasks.current().headline_metric
    best = f" (best {metrics[f'best_{headline}']:.4f} at step {metrics['best_step']})" if "best_step" in metrics else ""
    print(
        f"eval {describe(metrics)} at step {step}{best}; "
        f"training {metrics['examples_per_second']:.1f} examples/s; metrics -> {run_path(output_dir, 'metrics.json')}; "
        f"SavedModel -> {export_dir}",
        flush=True,
    )
    print(f"timings: {timings}", flush=True)
    print(goodput.describe(record, cfg.train.steps_per_execution), flush=True)
    return {**metrics, "goodput": record}


def summarize_history(monitor: TrainingMonitor) -> dict:
    best, headline = monitor.best(), tasks.current().headline_metric
    return {f"best_{headline}": best[headline], "best_step": best["step"], "history": monitor.history}


def read_metrics(output_dir: str) -> dict:
    path = run_path(output_dir, "metrics.json")
    if not tf.io.gfile.exists(path):
        return {}
    with tf.io.gfile.GFile(path) as handle:
        return json.load(handle)


def export(model: keras.Model, output_dir: str, manifest: dict, cfg: config_lib.Config) -> str:
    """A SavedModel with the task's serving signature (shaped by the config's `predict:` keys), and
    in its assets.extra/ what `predict` needs: the manifest and the task's assets (e.g. its tokenizer)."""
    task = tasks.current()
    path = run_path(output_dir, "export")
    options = tf.saved_model.SaveOptions(experimental_io_device="/job:localhost")
    signature = task.serving_signature(model, manifest, cfg.predict)
    tf.saved_model.save(model, path, signatures={"serving_default": signature}, options=options)
    extra = run_path(path, "assets.extra")
    tf.io.gfile.makedirs(extra)
    files = {
        "manifest.json": json.dumps(manifest, indent=2).encode(),
        **task.export_assets(manifest, cfg.data.dir),
    }
    for name, content in files.items():
        with tf.io.gfile.GFile(run_path(extra, name), "wb") as handle:
            handle.write(content)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    cfg, _ = config_lib.command_line(__doc__.split("\n\n")[0], argv)
    train(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
