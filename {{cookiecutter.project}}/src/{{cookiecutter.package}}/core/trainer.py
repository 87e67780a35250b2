"""Training: strategy -> input -> model -> fit with checkpoints, logs and profiling -> evaluation.

`train(cfg, task)` runs (or resumes) one start of a run; `Trainer.run` is its story, one named step
a line, each step taking the values the steps before it made and returning its own. A run lives in
`runtime.output_dir` (run_dir.py). Starting again resumes from the latest checkpoint; SIGTERM or a
metadata notice saves a checkpoint and raises `Preempted` within one execution of
`steps_per_execution` steps (the command exits with 143); a NaN loss stops the run without saving.
The run record says how each start ended (goodput.py): a run that finished (at the same
`train.total_steps`) or stopped early is evaluated again by the next start, not trained further.
What happens between executions is in callbacks.py, one callback per concern, each reporting into
one `callbacks.Report`.
"""

from __future__ import annotations

import dataclasses
import math
import time

import tensorflow as tf

from . import callbacks, distribute, goodput, input_cursor, input_pipeline, memory, precision
from . import profiler
from . import schedule, warm_start
from . import utilisation as utilisation_lib
from . import config as config_lib
from . import steps_per_execution as spe_lib
from .evaluation import describe, evaluate_model, judged, write_eval_summaries
from .keras import keras
from .levers import out_of_memory_reported, replica_hbm_bytes
from .model import build_model, compile_model, metric_names, step_metric_names
from .run_dir import RunRecord, export, latest_checkpoint, restore_newest_readable, run_path, write_atomically
from .topology import Target


class Preempted(Exception):
    """The run stopped for a preemption or maintenance notice, its checkpoint saved; the same
    command resumes it."""

    def __init__(self, reason: str, step: int):
        super().__init__(f"preempted ({reason}) at step {step}")
        self.reason, self.step = reason, step


def train(cfg: config_lib.Config, task, started: float | None = None) -> dict:
    """Runs (or resumes) training and the final evaluation of `task`; returns the metrics. `started`:
    when this start began (time.perf_counter; `make train` passes its process's start), else now."""
    return Trainer(cfg, task, started).run()


# ------------------------------------------------------------------------ what the steps make


@dataclasses.dataclass(frozen=True)
class Start:
    """What a start resolved before building anything."""

    cfg: config_lib.Config
    """The loaded config with the precision that runs in place of `auto`."""
    target: Target
    manifest: dict
    record: RunRecord
    """The run record (metrics.json) as the previous start left it."""
    previous_end: str | None
    """How the previous start ended (goodput's ends), None for a new run."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """The model of this start, restored from the newest readable checkpoint."""

    model: keras.Model
    manager: tf.train.CheckpointManager
    """The rotating checkpoints (train.keep_checkpoints)."""
    best_manager: tf.train.CheckpointManager
    """The best periodic evaluation's checkpoint, in its own folder: the rotation never deletes it."""
    cursor: input_cursor.InputCursor
    """The train input's position, saved with every checkpoint."""
    initial_step: int
    remaining: int
    """Steps this start trains: none for a run that finished or stopped early."""
    decision: spe_lib.Decision


@dataclasses.dataclass(frozen=True)
class Ready:
    """What training runs with: the config with the steps_per_execution it trains with in place of
    `auto`, and the train input (None when nothing remains to train)."""

    cfg: config_lib.Config
    dataset: object | None


class Trainer:
    """One start of a run: the config and the task it was given, and the phase clock of the start.
    Each method is a step of `run`, in order."""

    def __init__(self, cfg: config_lib.Config, task, started: float | None = None):
        self.cfg, self.task = cfg, task
        self.clock = goodput.PhaseClock(since=started)

    def run(self) -> dict:
        start = self.resolve()
        # Out of device memory anywhere after this (the variables, calibration, a step, an evaluation,
        # the export): the one line with the estimate and the levers.
        with out_of_memory_reported(start.cfg, self.task, start.manifest, start.target):
            restored = self.build_and_restore(start)
            ready = self.settle_steps_per_execution(start, restored)
            progress = goodput.StartRecord(start.record, self.clock, restored.initial_step)
            report = self.fit(start, restored, ready, progress)
            if report.stop and report.stop.end == goodput.PREEMPTED:
                self.stop_preempted(ready.cfg, restored, report, progress)
            return self.finish(start, restored, ready, report, progress)

    # ------------------------------------------------------------------------------------ steps

    def resolve(self) -> Start:
        """Where it runs, what data it reads, the precision and the seeds; prints the data line."""
        cfg = self.cfg
        if cfg.runtime.deterministic:  # before any op runs; for the rest of the process
            tf.config.experimental.enable_op_determinism()
        with self.clock.phase(goodput.STRATEGY):
            target = distribute.resolve(cfg.runtime)
        with self.clock.phase(goodput.DATA_CHECK):
            manifest = input_pipeline.read_manifest(cfg.data.dir, self.task, cfg.data)
        per_replica = target.per_replica_batch_size(cfg.train.global_batch_size)
        # config.yaml and metrics.json record the precision that ran, not `auto`.
        chosen = precision.apply(cfg.runtime.mixed_precision, target.kind)
        cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, mixed_precision=chosen.precision))
        keras.utils.set_random_seed(cfg.runtime.seed)
        tf.io.gfile.makedirs(cfg.runtime.output_dir)
        record = RunRecord(cfg.runtime.output_dir)
        previous = record.last_start
        print(describe_start(cfg, self.task, target, manifest, per_replica, chosen.describe()), flush=True)
        return Start(cfg, target, manifest, record, previous["end"] if previous else None)

    def build_and_restore(self, start: Start) -> Restored:
        """The model (compiled with the steps_per_execution `spe_lib.decide` chose), its optimizer
        slots, the checkpoint managers, and the restore of the newest readable checkpoint."""
        cfg, task, output_dir = start.cfg, self.task, start.cfg.runtime.output_dir
        # A run whose last start finished (at this total_steps) or stopped early is only evaluated
        # again: nothing is measured, and its config.yaml keeps describing the training that made it.
        furthest = start.record.last_start["furthest_step"] if start.previous_end else 0
        done = latest_checkpoint(output_dir) is not None and (
            start.previous_end == goodput.STOPPED_EARLY
            or (start.previous_end == goodput.FINISHED and furthest >= cfg.train.total_steps)
        )
        decision = spe_lib.decide(cfg, start.target, start.record.calibration, done)
        with self.clock.phase(goodput.MODEL_BUILD):
            with start.target.strategy.scope():
                model = build_model(cfg, task, start.manifest)
                compile_model(model, cfg, task, start.manifest, decision.compiled)
                # The optimizer's slots exist before the restore, so that it fills them at once: Keras
                # would otherwise create them at the first update, and a finished run (evaluated, never
                # updated) would warn about every slot value the checkpoint holds.
                model.optimizer.build(model.trainable_variables)
            cursor = input_cursor.InputCursor(
                input_cursor.layout(cfg, start.manifest, start.target.hosts, start.target.replicas),
                step=lambda: model.optimizer.iterations.numpy(),
            )
            checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, input=cursor)
            manager = tf.train.CheckpointManager(
                checkpoint, run_path(output_dir, "checkpoints"), max_to_keep=cfg.train.keep_checkpoints
            )
            best_manager = tf.train.CheckpointManager(
                checkpoint, run_path(output_dir, "checkpoints", "best"), max_to_keep=1
            )
        with self.clock.phase(goodput.RESTORE):
            resumed = restore_newest_readable(checkpoint, manager, cursor)
            self.initialise(start, model, resumed)
        initial_step = int(model.optimizer.iterations.numpy())
        if done and initial_step < furthest:  # its newest checkpoint could not be read: train on to it
            print(
                f"the run {start.previous_end} at step {furthest}, restored at {initial_step}: training on", flush=True
            )
            done = False
        order = cursor.resume(initial_step, reseed=cfg.runtime.resume_input == "reseed")
        if order.note:
            print(order.note, flush=True)
        if done:
            print(
                f"this run {start.previous_end} at step {initial_step}: evaluating it again, training no further "
                "(a larger train.total_steps trains a finished run on; a new runtime.output_dir starts afresh)",
                flush=True,
            )
        print(
            f"resumed from step {initial_step}, the input at its step {initial_step - order.from_step} "
            f"of the order seeded {order.seed}"
            if initial_step
            else "starting from step 0",
            flush=True,
        )
        remaining = 0 if done else max(0, cfg.train.total_steps - initial_step)
        return Restored(model, manager, best_manager, cursor, initial_step, remaining, decision)

    def initialise(self, start: Start, model, resumed: str | None) -> None:
        """A new run's weights from `train.init_from` (a resume has its own: the source is not read);
        the count of parameters that train where some do not."""
        train = start.cfg.train
        if train.init_from and resumed is None:
            with start.target.strategy.scope():
                source, found = warm_start.load(model, train.init_from, train.init_skip, start.manifest)
            print(found.describe(source), flush=True)
            start.record.update(initialised_from=found.summary(source, train.init_from))
        elif train.init_from:
            print(f"train.init_from not read: this run resumes its own checkpoint {resumed}", flush=True)
        if train.init_from or train.freeze:
            print(warm_start.parameters_line(model, train.freeze), flush=True)

    def settle_steps_per_execution(self, start: Start, restored: Restored) -> Ready:
        """The train input for this start, and the steps_per_execution it trains with (measured on the
        restored model when `auto` has nothing stored for this setting); writes config.yaml."""
        cfg, order = start.cfg, restored.cursor.order
        dataset = (
            input_pipeline.training_dataset(
                cfg,
                self.task,
                start.target,
                start.manifest,
                seed=order.seed,
                start_step=restored.initial_step - order.from_step,
                first_epoch=order.first_epoch,
                pending=order.pending,
                from_step=order.from_step,
            )
            if restored.remaining > 0
            else None
        )
        decision = restored.decision
        if dataset is None and decision.measure:  # killed after its last step: nothing left to measure on
            decision = spe_lib.Decision(decision.compiled)
        settled = spe_lib.settle(decision, cfg, restored.model, dataset, start.target.strategy, self.clock)
        cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, steps_per_execution=settled.steps_per_execution)
        )
        if settled.calibration:
            start.record.update(calibration=settled.calibration)
        if restored.remaining > 0:
            write_atomically(run_path(cfg.runtime.output_dir, "config.yaml"), config_lib.dump(cfg))
        print(
            f"steps_per_execution {cfg.train.steps_per_execution}; checkpoints every {cfg.train.checkpoint_every} "
            f"steps to {restored.manager.directory}"
            + (f"; evaluation every {cfg.train.eval_every} steps" if cfg.train.eval_every else "")
            + (
                f"; early stop after {cfg.train.early_stop_patience} evaluations without improvement"
                if cfg.train.early_stop_patience and cfg.train.eval_every
                else ""
            ),
            flush=True,
        )
        return Ready(cfg, dataset)

    def fit(self, start: Start, restored: Restored, ready: Ready, progress: goodput.StartRecord) -> callbacks.Report:
        """Keras' fit over the remaining steps with the callbacks, under the preemption watch; returns
        what the callbacks reported."""
        cfg = ready.cfg
        if cfg.runtime.profiler_port:
            profiler.start_server(cfg.runtime.profiler_port)
        writer = tf.summary.create_file_writer(run_path(cfg.runtime.output_dir, "logs", "train"))
        history = [entry for entry in start.record.history if entry["step"] <= restored.initial_step]
        report = callbacks.Report(step=restored.initial_step, earlier=history)
        # The two whose ends outlive a callback's: a trace to close and a signal handler to remove.
        profile_window = callbacks.ProfileWindow(restored.initial_step, cfg.profile_window(), cfg.runtime.output_dir)
        preemption = callbacks.Preemption(
            restored.initial_step, restored.manager, cfg.runtime.metadata_poll_seconds, report
        )
        callback_list = self.callbacks(start, restored, ready, report, writer, progress, profile_window, preemption)
        with self.clock.phase(goodput.TRAINING):
            try:
                with preemption.watching():
                    if restored.remaining > 0:
                        restored.model.fit(
                            ready.dataset,
                            epochs=1,
                            steps_per_epoch=restored.remaining,
                            callbacks=callback_list,
                            verbose=0,
                        )
            except callbacks.NonFiniteLoss:
                progress.write(report.step, end=goodput.NON_FINITE_LOSS)
                raise
            finally:
                profile_window.stop()
                writer.flush()
            self.clock.move(report.evaluation_seconds, goodput.TRAINING, goodput.EVALUATION)
            if report.checkpoint_blocking_seconds:  # the saves held training: booked apart, as a loss
                self.clock.move(sum(report.checkpoint_blocking_seconds), goodput.TRAINING, goodput.CHECKPOINT)
            if restored.remaining > 0:
                # From the last step's callback to fit() returning: releasing the input iterators. Near
                # 0 s; the tf.data autotuning race described in input_pipeline.py made it minutes.
                self.clock.move(time.perf_counter() - report.end_time, goodput.TRAINING, goodput.END_OF_FIT)
        if report.checkpoint_blocking_seconds:
            held = report.checkpoint_blocking_seconds
            print(
                f"checkpoint saves held training {sum(held):.2f} s ({max(held):.2f} s at most"
                + (", written in the background)" if cfg.train.async_checkpoint else ")"),
                flush=True,
            )
        return report

    def callbacks(
        self, start, restored, ready, report, writer, progress, profile_window, preemption
    ) -> list[keras.callbacks.Callback]:
        """Between executions, in the order they act (callbacks.py says what each does), then the
        task's own (`Task.build_callbacks`)."""
        cfg, task, manifest, step = ready.cfg, self.task, start.manifest, restored.initial_step
        output_dir, names = cfg.runtime.output_dir, metric_names(cfg, task, start.manifest)
        monitor, mode = self.monitor()

        def utilisation() -> utilisation_lib.Utilisation:
            """The step's model FLOPs (traced from the model, core/memory.py) against the chip's peak."""
            return utilisation_lib.of_model(restored.model, cfg, start.target)

        chosen = [
            callbacks.FirstExecution(step, self.clock, report),
            callbacks.NanGuard(step, restored.manager),
            callbacks.StepLog(step, cfg, writer, step_metric_names(cfg, task, manifest), utilisation, report),
            callbacks.GoodputProgress(step, cfg.train.log_every, cfg.train.total_steps, progress.write),
            profile_window,
            callbacks.Checkpoints(
                step, restored.manager, cfg.train.checkpoint_every, report, cfg.train.async_checkpoint, writer
            ),
            preemption,
            callbacks.PeriodicEvaluation(
                step,
                cfg.train.eval_every,
                cfg.train.total_steps,
                evaluate=lambda: evaluate_model(restored.model, start.target.strategy, cfg, task, manifest),
                best_manager=restored.best_manager,
                monitor=monitor,
                mode=mode,
                metric_names=names,
                write_summaries=lambda metrics, at: write_eval_summaries(output_dir, metrics, at, names),
                describe=lambda metrics: describe(metrics, names, task, manifest.get("baselines")),
                report=report,
            ),
        ]
        if cfg.train.early_stop_patience and cfg.train.eval_every:
            chosen.append(
                callbacks.EarlyStopping(
                    step,
                    monitor,
                    mode,
                    cfg.train.early_stop_patience,
                    cfg.train.early_stop_min_delta,
                    report.history,
                    report,
                )
            )
        return [*chosen, *task.build_callbacks(cfg, output_dir)]

    def stop_preempted(self, cfg, restored: Restored, report: callbacks.Report, progress: goodput.StartRecord):
        """The checkpoint is saved (callbacks.Preemption): records this start and raises Preempted."""
        reason = report.stop.detail
        print(
            f"preempted ({reason}) at step {report.step}: checkpoint saved to "
            f"{restored.manager.latest_checkpoint}; run the same command again to resume",
            flush=True,
        )
        monitor, mode = self.monitor()
        with self.clock.phase(goodput.TRAINING):  # the record's write, booked where fit left the clock
            progress.record.update(**callbacks.evaluation_summary(report.history, monitor, mode))
            summary = progress.write(report.step, end=goodput.PREEMPTED)
            print(f"timings: {self.clock.report()}", flush=True)
        print(goodput.describe(summary, cfg.train.steps_per_execution), flush=True)
        raise Preempted(reason, report.step)

    def monitor(self) -> tuple[str, str]:
        """What the best evaluation and early stopping go by: the task's headline metric as Keras' logs
        name it (`eval_<metric>`), and whether higher ('max') or lower ('min') is better."""
        return f"eval_{self.task.headline_metric}", "max" if self.task.higher_is_better else "min"

    def finish(self, start, restored, ready, report, progress) -> dict:
        """The last checkpoint, the final evaluation, the figures of training, the export, the run
        record and the report."""
        cfg, step = ready.cfg, report.step
        stop = report.stop
        if stop is None and restored.remaining > 0 and step < cfg.train.total_steps:  # another callback's stop
            stop = callbacks.Stop(goodput.STOPPED_EARLY, f"a callback set model.stop_training at step {step}")
        with self.clock.phase(goodput.CHECKPOINT):  # whole before anything reads it (the export, make eval)
            callbacks.save_checkpoint(restored.manager, step, report)
        with self.clock.phase(goodput.EVALUATION):
            metrics = self.final_evaluation(start, restored, ready, report)
        with self.clock.phase(goodput.EXPORT):  # with the record's writing, as the report's last phase
            export_dir = export(restored.model, cfg.runtime.output_dir, start.manifest, cfg, self.task)
            metrics["phase_seconds"] = self.clock.so_far()
            metrics["time_to_first_step_seconds"] = round(goodput.time_to_first_step(metrics["phase_seconds"]), 2)
            if stop:
                metrics["stopped_early"] = stop.detail
            elif restored.remaining == 0 and start.previous_end == goodput.STOPPED_EARLY:
                metrics["stopped_early"] = start.record.get("stopped_early", "")
            start.record.update(**metrics)
            end = stop.end if stop else (start.previous_end if restored.remaining == 0 else None)
            summary = progress.write(step, end=end if end in goodput.DONE else goodput.FINISHED)
            self.print_summary(start, ready, metrics, summary, export_dir)
        return {**metrics, "goodput": summary}

    def final_evaluation(self, start: Start, restored: Restored, ready: Ready, report: callbacks.Report) -> dict:
        """The evaluation at the last step with everything the run measured beside it: throughput,
        utilisation, the baselines, checkpoint saves, device memory and the periodic evaluations."""
        cfg, task, manifest, step = ready.cfg, self.task, start.manifest, report.step
        stopped_at_evaluation = report.last_evaluation and report.last_evaluation[0] == step
        evaluated = (
            dict(report.last_evaluation[1])
            if stopped_at_evaluation  # an early stop comes right after an evaluation of these weights
            else evaluate_model(restored.model, start.target.strategy, cfg, task, manifest)
        )
        metrics = judged(evaluated, step, task, manifest)
        # Over what an earlier start wrote: a rerun of a finished run renews the evaluation, keeps
        # the rest, and keeps the run's throughput (no step trained in this start).
        throughput = report.examples_per_second(cfg.effective_batch_size)
        if not math.isfinite(throughput):
            throughput = start.record.examples_per_second or 0.0
        metrics.update(examples_per_second=throughput, mixed_precision=cfg.runtime.mixed_precision)
        if report.utilisation is not None and throughput > 0:
            metrics.update(report.utilisation.metrics(throughput / cfg.effective_batch_size))
        if report.checkpoint_write_seconds:  # the longest save, for the preemption window (make doctor)
            metrics["checkpoint_save_seconds"] = round(max(report.checkpoint_write_seconds), 3)
        if report.checkpoint_blocking_seconds:
            metrics["checkpoint_blocking_seconds"] = round(sum(report.checkpoint_blocking_seconds), 3)
        if restored.remaining > 0:  # a start that only evaluates measures no training step
            metrics.update(measured_memory(cfg, task, start.target, manifest))
        names = metric_names(cfg, task, manifest)
        if cfg.train.eval_every:
            monitor, mode = self.monitor()
            if report.record_evaluation(step, metrics, names, monitor, mode):
                restored.best_manager.save(checkpoint_number=step)
            write_eval_summaries(cfg.runtime.output_dir, metrics, step, names)
            metrics.update(callbacks.evaluation_summary(report.history, monitor, mode))
        else:
            write_eval_summaries(cfg.runtime.output_dir, metrics, step, names)
        return metrics

    def print_summary(self, start: Start, ready: Ready, metrics: dict, summary: dict, export_dir: str) -> None:
        """The final lines: the evaluation (and the best), throughput and memory, timings, goodput."""
        headline = self.task.headline_metric
        best = (
            f" (best {metrics[f'best_{headline}']:.4f} at step {metrics['best_step']})"
            if "best_step" in metrics
            else ""
        )
        names = metric_names(ready.cfg, self.task, start.manifest)
        described = describe(metrics, names, self.task, start.manifest.get("baselines"))
        stopped = f"; stopped early: {metrics['stopped_early']}" if "stopped_early" in metrics else ""
        print(
            f"eval {described} at step {metrics['global_step']}{best}{stopped}; training "
            f"{metrics['examples_per_second']:.1f} examples/s{describe_memory(metrics)}; metrics -> "
            f"{start.record.path}; SavedModel -> {export_dir}",
            flush=True,
        )
        print(f"timings: {self.clock.report()}", flush=True)
        print(goodput.describe(summary, ready.cfg.train.steps_per_execution), flush=True)


# ------------------------------------------------------------------------------- the pieces


def measured_memory(cfg: config_lib.Config, task, target: Target, manifest: dict) -> dict:
    """On a GPU or TPU, the devices' peak memory (`peak_memory_bytes`) beside the plan's estimate
    per replica (`planned_memory_bytes`, core/memory.py), so that the first real run checks the
    plan; nothing on a CPU."""
    peak = device_peak_bytes(target.kind)
    if peak is None:
        return {}
    measured = {"peak_memory_bytes": peak}
    per_replica = target.per_replica_batch_size(cfg.train.global_batch_size)
    try:
        plan = memory.estimate_for(cfg, task, manifest, per_replica, replica_hbm_bytes(target))
        measured["planned_memory_bytes"] = int(plan.total)
    except Exception as failure:  # noqa: BLE001 - the plan is a check; the run's results are the news
        print(f"note: no memory plan to set the peak against ({type(failure).__name__}: {failure})", flush=True)
    return measured


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


def describe_start(
    cfg: config_lib.Config, task, target: Target, manifest: dict, per_replica: int, precision: str
) -> str:
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
        f"{task.describe_data(manifest)}; global batch {cfg.train.global_batch_size} = "
        f"{per_replica} per replica x {target.replicas}{effective}; learning rate {peak:g} (= "
        f"{cfg.train.base_learning_rate:g} x {cfg.effective_batch_size}/{cfg.train.base_batch_size}), "
        f"warm-up {cfg.train.warmup_steps} updates; precision {precision}"
    )
