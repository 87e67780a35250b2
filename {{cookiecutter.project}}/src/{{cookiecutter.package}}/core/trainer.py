"""Training: strategy -> input -> model -> fit with checkpoints, logs and profiling -> evaluation.

`train(cfg)` runs (or resumes) one start of a run; `Trainer.run` is its story, one named step a
line. A run lives in `runtime.output_dir` (run_dir.py). Starting again resumes from the latest
checkpoint; SIGTERM or a metadata notice saves a checkpoint and raises `Preempted` within one
execution of `steps_per_execution` steps (the command exits with 143); a NaN loss stops the run
without saving. What happens between executions is in callbacks.py, one callback per concern.
"""

from __future__ import annotations

import contextlib
import math
import time

import tensorflow as tf

from . import baselines, callbacks, distribute, goodput, input_cursor, input_pipeline, levers, memory, precision
from . import profiler
from . import schedule
from . import utilisation as utilisation_lib
from .. import tasks
from . import config as config_lib
from . import steps_per_execution as spe_lib
from .errors import UserError
from .evaluation import describe, evaluate_model, write_eval_summaries
from .keras import keras
from .model import build_model, compile_model, metric_names, step_metric_names
from .run_dir import RunRecord, checkpoint_step, export, latest_checkpoint, run_path
from . import topology as topology_lib
from .topology import Target


class Preempted(Exception):
    """The run stopped for a preemption or maintenance notice, its checkpoint saved; the same
    command resumes it."""

    def __init__(self, reason: str, step: int):
        super().__init__(f"preempted ({reason}) at step {step}")
        self.reason, self.step = reason, step


def train(cfg: config_lib.Config) -> dict:
    """Runs (or resumes) training and the final evaluation; returns the metrics."""
    return Trainer(cfg).run()


class Trainer:
    """One start of a run. Each method is a step of `run`, in order; what a step learns that later
    steps need is kept on the trainer (target, manifest, model, initial_step, ...)."""

    def __init__(self, cfg: config_lib.Config):
        self.cfg = cfg
        self.clock = goodput.PhaseClock()

    def run(self) -> dict:
        self.resolve()
        # Out of device memory anywhere after this (the variables, calibration, a step, an evaluation,
        # the export): the one line with the estimate and the levers.
        with out_of_memory_reported(self.cfg, self.manifest, self.target):
            self.build_and_restore()
            self.settle_steps_per_execution()
            self.fit()
            if self.preemption.reason:
                self.stop_preempted()
            return self.finish()

    # ------------------------------------------------------------------------------------ steps

    def resolve(self) -> None:
        """Where it runs, what data it reads, the precision and the seeds; prints the data line."""
        cfg, clock = self.cfg, self.clock
        if cfg.runtime.deterministic:  # before any op runs; for the rest of the process
            tf.config.experimental.enable_op_determinism()
        clock.start(goodput.STRATEGY)
        self.target = distribute.resolve(cfg.runtime)
        clock.start(goodput.DATA_CHECK)
        self.manifest = input_pipeline.read_manifest(cfg.data.dir, cfg.data)
        clock.start(goodput.START_UP)
        per_replica = self.target.per_replica_batch_size(cfg.train.global_batch_size)
        # config.yaml and metrics.json record the precision that ran, not `auto`.
        chosen_precision = precision.apply(cfg.runtime.mixed_precision, self.target.kind)
        cfg.runtime.mixed_precision = chosen_precision.precision
        keras.utils.set_random_seed(cfg.runtime.seed)
        tf.io.gfile.makedirs(cfg.runtime.output_dir)
        self.record = RunRecord(cfg.runtime.output_dir)
        print(describe_start(cfg, self.target, self.manifest, per_replica, chosen_precision.describe()), flush=True)

    def build_and_restore(self) -> None:
        """The model (compiled with the steps_per_execution `spe_lib.decide` chose), its optimizer
        slots, the checkpoint managers, and the restore of the newest readable checkpoint."""
        cfg, clock, output_dir = self.cfg, self.clock, self.cfg.runtime.output_dir
        latest = latest_checkpoint(output_dir)
        # A finished run is only evaluated again: nothing is measured, and its config.yaml keeps
        # describing the training that produced it.
        self.finished = latest is not None and checkpoint_step(latest) >= cfg.train.total_steps
        self.decision = spe_lib.decide(cfg, self.target, self.record.values, self.finished)
        clock.start(goodput.MODEL_BUILD)
        with self.target.strategy.scope():
            self.model = compile_model(build_model(cfg, self.manifest), cfg, self.manifest, self.decision.compiled)
            # The optimizer's slots exist before the restore, so that it fills them at once: Keras would
            # otherwise create them at the first update, and a finished run (evaluated, never updated)
            # would warn about every slot value the checkpoint holds.
            self.model.optimizer.build(self.model.trainable_variables)
        # The train input's position, saved with every checkpoint (input_cursor.py).
        self.cursor = input_cursor.InputCursor(
            input_cursor.layout(cfg, self.manifest, self.target.hosts, self.target.replicas),
            step=lambda: self.model.optimizer.iterations.numpy(),
        )
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer, input=self.cursor)
        self.manager = tf.train.CheckpointManager(
            checkpoint, run_path(output_dir, "checkpoints"), max_to_keep=cfg.train.keep_checkpoints
        )
        # The best periodic evaluation's checkpoint, in its own folder: the rotation above never deletes it.
        self.best_manager = tf.train.CheckpointManager(
            checkpoint, run_path(output_dir, "checkpoints", "best"), max_to_keep=1
        )
        clock.start(goodput.RESTORE)
        restore_newest_readable(checkpoint, self.manager, self.cursor)
        self.initial_step = int(self.model.optimizer.iterations.numpy())
        clock.start(goodput.START_UP)
        order = self.cursor.resume(self.initial_step, reseed=cfg.runtime.resume_input == "reseed")
        if order.note:
            print(order.note, flush=True)
        print(
            f"resumed from step {self.initial_step}, the input at its step {self.initial_step - order.from_step} "
            f"of the order seeded {order.seed}"
            if self.initial_step
            else "starting from step 0",
            flush=True,
        )

    def settle_steps_per_execution(self) -> None:
        """The train input for this start, and the steps_per_execution it trains with (measured on the
        restored model when `auto` has nothing stored for this setting); writes config.yaml."""
        cfg = self.cfg
        self.remaining = cfg.train.total_steps - self.initial_step
        order = self.cursor.order
        self.dataset = (
            training_dataset(
                cfg, self.target, self.manifest, seed=order.seed, start_step=self.initial_step - order.from_step
            )
            if self.remaining > 0
            else None
        )
        spe_lib.settle(self.decision, cfg, self.model, self.dataset, self.target.strategy, self.clock)
        if not self.finished:
            with tf.io.gfile.GFile(run_path(cfg.runtime.output_dir, "config.yaml"), "w") as handle:
                handle.write(config_lib.dump(cfg))
        print(
            f"steps_per_execution {cfg.train.steps_per_execution}; checkpoints every {cfg.train.checkpoint_every} "
            f"steps to {self.manager.directory}"
            + (f"; evaluation every {cfg.train.eval_every} steps" if cfg.train.eval_every else ""),
            flush=True,
        )

    def fit(self) -> None:
        """Keras' fit over the remaining steps with the callbacks, under the preemption watch."""
        cfg = self.cfg
        # This start's entry in the goodput record, rewritten as it goes (see goodput.py).
        self.earlier_starts = self.record.get("goodput", {}).get("per_start", [])
        self.this_start = {"initial_step": self.initial_step, "furthest_step": self.initial_step, "end": "running"}
        if cfg.runtime.profiler_port:
            profiler.start_server(cfg.runtime.profiler_port)
        self.writer = tf.summary.create_file_writer(run_path(cfg.runtime.output_dir, "logs", "train"))
        callback_list = self.callbacks()
        self.clock.start(goodput.FIRST_EXECUTION if self.remaining > 0 else goodput.TRAINING)
        try:
            with self.preemption.watching():
                if self.remaining > 0:
                    self.model.fit(
                        self.dataset, epochs=1, steps_per_epoch=self.remaining, callbacks=callback_list, verbose=0
                    )
        finally:
            self.profile_window.stop()
            self.writer.flush()
        self.clock.move(self.evaluation.seconds, goodput.TRAINING, goodput.EVALUATION)
        if self.remaining > 0:
            # From the last step's callback to fit() returning: releasing the input iterators. Near 0 s;
            # the tf.data autotuning race described in input_pipeline.py made it minutes.
            self.clock.move(time.perf_counter() - self.first_execution.end_time, goodput.TRAINING, goodput.END_OF_FIT)
        self.step = self.first_execution.step
        if self.checkpoints.save_seconds:
            seconds = self.checkpoints.save_seconds
            print(f"checkpoint save: {max(seconds):.2f} s at most ({len(seconds)} saves)", flush=True)

    def callbacks(self) -> list[keras.callbacks.Callback]:
        """Between executions, in the order they act (callbacks.py says what each does)."""
        cfg, step, output_dir = self.cfg, self.initial_step, self.cfg.runtime.output_dir
        names = self.metric_names = metric_names(cfg, self.manifest)
        self.first_execution = callbacks.FirstExecution(step, self.clock)
        self.profile_window = callbacks.ProfileWindow(step, cfg.profile_window(), output_dir)
        self.checkpoints = callbacks.Checkpoints(step, self.manager, cfg.train.checkpoint_every)
        self.preemption = callbacks.Preemption(step, self.checkpoints, cfg.runtime.metadata_poll_seconds)
        self.step_log = callbacks.StepLog(
            step, cfg, self.writer, step_metric_names(cfg, self.manifest), self.utilisation
        )
        history = [entry for entry in self.record.get("history", []) if entry["step"] <= step]
        self.evaluation = callbacks.PeriodicEvaluation(
            step,
            cfg,
            evaluate=lambda: evaluate_model(self.model, self.target.strategy, cfg, self.manifest),
            best_manager=self.best_manager,
            history=history,
            metric_names=names,
            write_summaries=lambda metrics, at: write_eval_summaries(output_dir, metrics, at, names),
            describe=lambda metrics: describe(metrics, names, self.manifest.get("baselines")),
        )
        return [
            self.first_execution,
            callbacks.NanGuard(step, self.manager),
            self.step_log,
            callbacks.GoodputProgress(step, cfg.train.log_every, cfg.train.total_steps, self.record_progress),
            self.profile_window,
            self.checkpoints,
            self.preemption,
            self.evaluation,
        ]

    def utilisation(self) -> utilisation_lib.Utilisation:
        """The step's model FLOPs (traced from the model, core/memory.py) against the chip's peak."""
        cfg = self.cfg
        self.flops_per_step = utilisation_lib.flops_per_step(self.model, cfg, self.target)
        return utilisation_lib.Utilisation(
            self.flops_per_step, self.target, cfg.runtime.mixed_precision, cfg.runtime.cache_dir
        )

    def record_progress(self, step: int, end: str = "running") -> dict:
        """This start's entry in the goodput record, written to the run record with the calibration."""
        self.this_start.update(furthest_step=step, phase_seconds=self.clock.so_far(), end=end)
        summary = goodput.summarize([*self.earlier_starts, self.this_start])
        if self.decision.stored:
            self.record.update(calibration=self.decision.stored)
        self.record.update(goodput=summary)
        self.record.write()
        return summary

    def stop_preempted(self) -> None:
        """The checkpoint is saved (callbacks.Preemption): records this start and raises Preempted."""
        print(
            f"preempted ({self.preemption.reason}) at step {self.step}: checkpoint saved to "
            f"{self.manager.latest_checkpoint}; run the same command again to resume",
            flush=True,
        )
        if self.evaluation.history:
            self.record.update(**self.evaluation.summary())
        summary = self.record_progress(self.step, end="preempted")
        print(f"timings: {self.clock.report()}", flush=True)
        print(goodput.describe(summary, self.cfg.train.steps_per_execution), flush=True)
        raise Preempted(self.preemption.reason, self.step)

    def measured_memory(self) -> dict:
        """On a GPU or TPU, the devices' peak memory (`peak_memory_bytes`) beside the plan's estimate
        per replica (`planned_memory_bytes`, core/memory.py), so that the first real run checks the
        plan; nothing on a CPU."""
        peak = device_peak_bytes(self.target.kind)
        if peak is None:
            return {}
        cfg, measured = self.cfg, {"peak_memory_bytes": peak}
        per_replica = self.target.per_replica_batch_size(cfg.train.global_batch_size)
        try:
            plan = memory.estimate_for(cfg, self.manifest, per_replica, replica_hbm_bytes(self.target))
            measured["planned_memory_bytes"] = int(plan.total)
        except Exception as failure:  # noqa: BLE001 - the plan is a check; the run's results are the news
            print(f"note: no memory plan to set the peak against ({type(failure).__name__}: {failure})", flush=True)
        return measured

    def finish(self) -> dict:
        """The last checkpoint, the final evaluation, the export, the run record and the report."""
        cfg, step, output_dir = self.cfg, self.step, self.cfg.runtime.output_dir
        if not self.checkpoints.saved(step):
            self.checkpoints.save(step)
        self.clock.start(goodput.EVALUATION)
        metrics = evaluate_model(self.model, self.target.strategy, cfg, self.manifest)
        # Over what an earlier start wrote: a rerun of a finished run renews the evaluation, keeps
        # the rest, and keeps the run's throughput (no step trained in this start).
        throughput = self.first_execution.examples_per_second(cfg.effective_batch_size, self.evaluation.seconds)
        if not math.isfinite(throughput):
            throughput = self.record.get("examples_per_second") or 0.0
        metrics.update(global_step=step, examples_per_second=throughput, mixed_precision=cfg.runtime.mixed_precision)
        used = getattr(self.step_log, "utilisation", None)
        if used is not None and throughput > 0:
            steps_per_second = throughput / cfg.effective_batch_size
            metrics["tflops_per_chip"] = round(used.tflops_per_chip(steps_per_second), 4)
            mfu = used.mfu(steps_per_second)
            if mfu is not None:
                metrics["model_flops_utilization"] = round(mfu, 4)
        metrics.update(baselines.summary(metrics[tasks.current().headline_metric], self.manifest.get("baselines")))
        if self.checkpoints.save_seconds:
            metrics["checkpoint_save_seconds"] = round(max(self.checkpoints.save_seconds), 3)
        if self.remaining > 0:  # a start that only evaluates measures no training step
            metrics.update(self.measured_memory())
        if cfg.train.eval_every:
            self.evaluation.record(step, metrics)
            metrics.update(self.evaluation.summary())
        else:
            write_eval_summaries(output_dir, metrics, step, self.metric_names)
        self.clock.start(goodput.EXPORT)
        export_dir = export(self.model, output_dir, self.manifest, cfg)
        metrics["phase_seconds"] = self.clock.so_far()
        metrics["time_to_first_step_seconds"] = round(goodput.time_to_first_step(metrics["phase_seconds"]), 2)
        self.record.update(**metrics)
        summary = self.record_progress(step, end="finished")
        timings = self.clock.report()
        headline = tasks.current().headline_metric
        best = (
            f" (best {metrics[f'best_{headline}']:.4f} at step {metrics['best_step']})"
            if "best_step" in metrics
            else ""
        )
        described = describe(metrics, self.metric_names, self.manifest.get("baselines"))
        print(
            f"eval {described} at step {step}{best}; training {metrics['examples_per_second']:.1f} "
            f"examples/s{describe_memory(metrics)}; metrics -> {self.record.path}; SavedModel -> {export_dir}",
            flush=True,
        )
        print(f"timings: {timings}", flush=True)
        print(goodput.describe(summary, cfg.train.steps_per_execution), flush=True)
        return {**metrics, "goodput": summary}


# ------------------------------------------------------------------------------- the pieces


def out_of_memory(cfg: config_lib.Config, manifest: dict, target: Target, error: Exception) -> str:
    """One line for a step that ran out of device memory: the estimate of what it needs (the model
    planned from its shapes, core/memory.py), the device's memory and the levers."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
    per_replica = target.per_replica_batch_size(cfg.train.global_batch_size)
    hbm = replica_hbm_bytes(target)
    try:
        plan = memory.estimate_for(cfg, manifest, per_replica, hbm)
        estimate = f"the step needs about {memory.gib(plan.total)} per replica ({plan.breakdown()})"
        if hbm:
            estimate += f" of {memory.gib(hbm)} HBM"
    except Exception as failure:  # noqa: BLE001 - the estimate is a help; the error is the news
        estimate = f"no estimate ({type(failure).__name__})"
    return (
        f"out of device memory at {per_replica} examples per replica ({first}); {estimate}; "
        f"`make doctor` shows the plan and what each lever saves: {levers.describe(cfg, cfg.runtime.mixed_precision)}"
    )


def replica_hbm_bytes(target: Target) -> int:
    """One replica's share of a TPU chip's HBM (a TensorCore's on v2/v3); 0 off a known TPU."""
    return topology_lib.chip(target.tpu_type).replica_hbm_bytes if target.kind == "tpu" and target.tpu_type else 0


def device_peak_bytes(kind: str) -> int | None:
    """The highest peak memory of this host's devices of `kind` since the process started
    (`tf.config.experimental.get_memory_info`), or None on a CPU, whose memory TensorFlow does not
    count this way, and where no device answers."""
    if kind not in ("gpu", "tpu"):
        return None
    peaks = []
    for device in tf.config.list_logical_devices(kind.upper()):
        try:
            peaks.append(int(tf.config.experimental.get_memory_info(device.name)["peak"]))
        except (ValueError, tf.errors.OpError):  # a device whose allocator keeps no statistics
            continue
    return max(peaks) if peaks else None


def describe_memory(metrics: dict) -> str:
    """The measured peak beside the plan, for the final line ('' where nothing was measured): e.g.
    '; device memory peak 12.6 GiB per replica against a plan of 11.0 GiB (1.15x)'."""
    peak, planned = metrics.get("peak_memory_bytes"), metrics.get("planned_memory_bytes")
    if peak is None:
        return ""
    against = f" against a plan of {memory.gib(planned)} ({peak / planned:.2f}x)" if planned else " (no plan)"
    return f"; device memory peak {memory.gib(peak)} per replica{against}"


@contextlib.contextmanager
def out_of_memory_reported(cfg: config_lib.Config, manifest: dict, target: Target):
    """Running out of device memory inside the block raises a UserError with `out_of_memory`'s one
    line instead of TensorFlow's traceback. `cfg.runtime.mixed_precision` is the precision that runs
    (the levers depend on it)."""
    try:
        yield
    except tf.errors.ResourceExhaustedError as error:
        raise UserError(out_of_memory(cfg, manifest, target, error)) from None


def describe_start(cfg: config_lib.Config, target: Target, manifest: dict, per_replica: int, precision: str) -> str:
    """The start-up line: data, batch, learning rate and precision."""
    peak = schedule.scaled_learning_rate(
        cfg.train.base_learning_rate, cfg.effective_batch_size, cfg.train.base_batch_size
    )
    accumulation = cfg.train.gradient_accumulation_steps
    effective = (
        f", effective batch {cfg.effective_batch_size} (= {cfg.train.global_batch_size} x {accumulation} accumulated)"
        if accumulation > 1
        else ""
    )
    splits = manifest["splits"]
    return (
        f"data: {splits['train']['num_examples']} train / {splits['eval']['num_examples']} eval examples, "
        f"{tasks.current().describe_data(manifest)}; global batch {cfg.train.global_batch_size} = "
        f"{per_replica} per replica x {target.replicas}{effective}; learning rate {peak:g} (= "
        f"{cfg.train.base_learning_rate:g} x {cfg.effective_batch_size}/{cfg.train.base_batch_size}), "
        f"warm-up {cfg.train.warmup_steps} updates; precision {precision}"
    )


def training_dataset(cfg: config_lib.Config, resolved: Target, manifest: dict, seed: int, start_step: int = 0):
    """The train split in the resumable order of `seed`, `start_step` steps into it, distributed over
    the replicas."""
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
        start_step=start_step,
        cache=cfg.data.cache,
    )
    return dataset


def choose_steps_per_execution(cfg: config_lib.Config, resolved: Target, manifest: dict):
    """(`train.steps_per_execution`, the measurements): measured on a model of its own when it is
    `auto` (benchmarks and tests; a run calibrates the model it trains, in `settle`)."""
    if not config_lib.is_auto(cfg.train.steps_per_execution):
        return int(cfg.train.steps_per_execution), []
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg, manifest), cfg, manifest, max(2, spe_lib.limit(cfg.train)))
    dataset = training_dataset(cfg, resolved, manifest, seed=cfg.runtime.seed)
    chosen, measurements = spe_lib.calibrate_and_report(cfg, model, iter(dataset))
    return chosen.steps_per_execution, measurements


def restore_newest_readable(
    checkpoint: tf.train.Checkpoint, manager: tf.train.CheckpointManager, cursor=None
) -> str | None:
    """Restores the newest checkpoint that can be read; returns its path, or None for a fresh start.

    A save cut short (the VM stopped mid-write, a truncated file on a full disk) leaves a newest
    checkpoint that cannot be read: that is not fatal, the one before it is used, and the log says so.
    A checkpoint written before the input's cursor (`cursor`, the checkpoint's `input`) existed is
    restored without it: the cursor then reports nothing restored.
    """
    for path in reversed(manager.checkpoints):
        try:
            if cursor is not None:
                cursor.restored = None
                if not input_cursor.saved_in(path):
                    tf.train.Checkpoint(model=checkpoint.model, optimizer=checkpoint.optimizer).restore(
                        path
                    ).assert_existing_objects_matched()
                    return path
            # Whatever the checkpoint holds beyond `checkpoint` (the input's cursor, for `make eval`) stays unread.
            checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
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
