"""Is training input-bound, and what does the trainer cost? The input pipeline against a naive
one, training on real data against training on synthetic data already in memory, and the trainer
against a bare `model.fit`, all measured in this one run.

    make bench            # python -m {{ cookiecutter.package }}.bench_input --config configs/local.yaml

- the data: bytes per example in the shards (what the host reads per example) and their format
- optimized: input_pipeline.train_pipeline (interleaved reads, batched parse with the
  task's decoding and augmentation, prefetch), in examples/s of this host
- naive: one file after another, parse one example at a time, no parallelism, no prefetch
- training steps/s on synthetic data (the ceiling the input must keep up with) and on real data;
  the optimized input's examples/s over synthetic training's: below 1 the host cannot keep up.
- synthetic training in the other precision: bfloat16's step time over float32's on this machine
  (near or under 1 where bfloat16 is native; several times 1 on a CPU that emulates it).
- the train order: the resumable one (input_pipeline.train_records: files in a stateless order,
  read one after another, windows of data.shuffle_buffer records permuted) against a buffer shuffle
  over 16 interleaved files (what cannot be resumed exactly): records/s, and how mixed an epoch is
  (adjacent records from the same file; distinct files per global batch). Preprocessing spreads
  examples over shards by hash, so a file is a random sample and a batch from few files is no less
  mixed in content. The same order read from memory (data.cache=auto) against the files.
- host peak: the best FLOP/s of a 2048 x 2048 matrix multiply, in float32 and bfloat16 (CPU only;
  stored in runtime.cache_dir, where every later run on this host reads it for its MFU)
- trainer: `make train`'s whole path for train.total_steps steps (callbacks, step log, checkpoints
  at train.checkpoint_every, the preemption watch), its steps/s as it reports them; bare:
  build_model + compile_model + model.fit on the same distributed input (the same order) with a
  timer only, the same steps, steps_per_execution and precision; both timed over the same window,
  from the second execution's start to fit's end (the first execution's tracing and compilation
  and the work at its end left out), alternating --rounds times, which one goes first alternating
  too; the ratio of the medians (goal >= 0.97). Then what the trainer adds inside that window, each
  callback's seconds at the boundaries (and the seconds its checkpoint saves held), against the
  difference between the two windows; what it does once at the first boundary, outside the window
  (the model FLOPs count, the background saves' set-up); what other threads did (checkpoint files
  written, metadata-server looks); the trainer's TFLOP/s per chip and model FLOPs utilisation.
- checkpoints: the seconds a save holds training (what the trainer logs as
  checkpoint_blocking_seconds), synchronous and written in the background (train.async_checkpoint),
  on the same model trained between saves: on local disk, and on the gs:// folder --gcs names (a
  bucket, or the tests' storage emulator, which only the tests start); the first two background
  saves apart (they set up the host copy and trace its copy function, once per start; the
  trainer's Checkpoints callback does that at its first boundary instead), the median
  of the rest, their ratio, and how long a background save's files take to write.
--only runs some of the parts, comma-separated (given after the dotted keys): input (the input,
the orders, training on synthetic and real data), peak, trainer, checkpoints; e.g. `--only
trainer`. If real-data training is more than 10% slower than synthetic, the input is the
bottleneck.
Fewer train shards than parallel reads (one shard: nothing to interleave) are pointed out.
The last line is JSON.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from typing import Sequence

import tensorflow as tf

from .core import config as config_lib
from .core import callbacks, distribute, gcp, input_pipeline, levers, precision, preemption, topology, utilisation
from . import tasks
from .core import steps_per_execution as spe_lib
from .core.errors import UserError, run_cli
from .core.keras import keras
from .core.model import build_model, compile_model
from .core.trainer import Trainer

INPUT_BOUND_MARGIN = 0.9
MIXING_LIMIT = 200_000  # records whose files the order comparison tracks


def examples_per_second(dataset: tf.data.Dataset, batch_size: int, min_seconds: float) -> float:
    iterator = iter(dataset)
    next(iterator)  # start the pipeline (threads, first file opens)
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < min_seconds or batches < 5:
        next(iterator)
        batches += 1
    return batches * batch_size / (time.perf_counter() - started)


def naive_dataset(
    files: list[str], task, manifest: dict, batch_size: int, compression: str, data_config=None
) -> tf.data.Dataset:
    """What a first version often looks like: sequential reads, per-example parsing, no prefetch."""

    def parse_one(record):
        inputs, targets = task.parse_batch(tf.expand_dims(record, 0), manifest, training=True, data_config=data_config)
        return tf.nest.map_structure(lambda tensor: tensor[0], (inputs, targets))

    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.map_parallelization = False
    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP" if compression == "gzip" else "")
    return dataset.repeat().map(parse_one).batch(batch_size, drop_remainder=True).with_options(options)


def training_steps_per_second(model, dataset, steps_per_execution: int, min_seconds: float) -> float:
    return spe_lib.measure(model, iter(dataset), steps_per_execution, min_seconds).steps_per_second


def compare_inputs(
    cfg, task, resolved, manifest: dict, files: list[str], counts, seconds: float
) -> tuple[float, float]:
    """Examples/s of the project's input and of a naive one on the same shards: (optimized, naive)."""
    batch, compression = cfg.train.global_batch_size, manifest.get("compression", "none")
    # Parallel reads need files to read in parallel: interleave opens at most one reader per file.
    parallel_reads = min(os.cpu_count() or 1, topology.SHARDS_PER_HOST)
    if len(files) < parallel_reads:
        what = (
            "nothing to interleave, one file is read at a time"
            if len(files) == 1
            else (f"at most {len(files)} files are read at a time")
        )
        print(
            f"note: {len(files)} train shard{'s' if len(files) > 1 else ''} for {os.cpu_count()} host cores: "
            f"{what}; write more with `make preprocess PREPROCESS_ARGS=--num_shards="
            f"{topology.SHARDS_PER_HOST * resolved.hosts}`",
            flush=True,
        )

    optimized = examples_per_second(
        input_pipeline.train_pipeline(
            files,
            counts,
            task,
            manifest,
            batch,
            seed=0,
            shuffle_buffer=cfg.data.shuffle_buffer,
            compression=compression,
            data_config=cfg.data,
        ),
        batch,
        seconds,
    )
    print(f"input, optimized : {optimized:10.1f} examples/s", flush=True)
    naive = examples_per_second(naive_dataset(files, task, manifest, batch, compression, cfg.data), batch, seconds)
    print(f"input, naive     : {naive:10.1f} examples/s   speedup {optimized / naive:.2f}x", flush=True)
    return optimized, naive


def buffer_shuffled(files: list[str], seed: int, buffer: int, compression: str) -> tf.data.Dataset:
    """The usual order that cannot be resumed exactly: shuffled files, 16 read at a time in parallel
    (in whatever order they answer), then a shuffle buffer."""
    dataset = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed).repeat()
    dataset = dataset.interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type="GZIP" if compression == "gzip" else ""),
        cycle_length=min(len(files), 16),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    return dataset.shuffle(buffer, seed=seed).with_options(input_pipeline.NO_AUTOTUNE)


def epoch_mixing(records, file_of: dict, batch: int) -> tuple[float, float]:
    """(share of adjacent records from the same file, mean distinct files per batch) of one epoch."""
    sources = [file_of[record] for record in records]
    same = sum(a == b for a, b in zip(sources, sources[1:])) / max(len(sources) - 1, 1)
    batches = [sources[i : i + batch] for i in range(0, len(sources) - batch + 1, batch)]
    return same, sum(len(set(part)) for part in batches) / max(len(batches), 1)


def compare_orders(cfg, manifest: dict, files: list[str], counts, seconds: float) -> dict:
    """The resumable train order against a buffer shuffle: records/s and the mixing of one epoch."""
    compression, window, seed = manifest.get("compression", "none"), cfg.data.shuffle_buffer, cfg.runtime.seed
    batch, total = cfg.train.global_batch_size, sum(counts)
    if total > MIXING_LIMIT:  # every record is held to find its file: a sample of the files
        kept = []
        for count in counts:
            if sum(kept) + count > MIXING_LIMIT:
                break
            kept.append(count)
        files, counts = files[: max(len(kept), 1)], counts[: max(len(kept), 1)]
        print(f"train order: measured on the first {len(files)} shards ({sum(counts)} records)", flush=True)
        total = sum(counts)
    file_of = {}
    for index, path in enumerate(files):
        for record in tf.data.TFRecordDataset(path, compression_type="GZIP" if compression == "gzip" else ""):
            file_of[record.numpy()] = index
    orders = {
        "resumable": input_pipeline.train_records(files, counts, seed=seed, window=window, compression=compression),
        "buffer": buffer_shuffled(files, seed, window, compression),
    }
    figures = {}
    for name, records in orders.items():
        rate = examples_per_second(records.batch(batch).prefetch(2), batch, seconds)
        same, distinct = epoch_mixing(list(records.take(total).as_numpy_iterator()), file_of, batch)
        figures[name] = {"records_per_s": rate, "same_file_neighbours": same, "files_per_batch": distinct}
        print(
            f"train order, {name:9s}: {rate:10.1f} records/s; adjacent records from one file {same:.2f}, "
            f"{distinct:.1f} files per batch of {batch}",
            flush=True,
        )
    # data.cache=auto: the same order from the records held in memory (read in once per process).
    started = time.perf_counter()
    from_memory = input_pipeline.train_records(
        files, counts, seed=seed, window=window, compression=compression, cache=True
    )
    read_in = time.perf_counter() - started
    cached_rate = examples_per_second(from_memory.batch(batch).prefetch(2), batch, seconds)
    cached_over_files = cached_rate / figures["resumable"]["records_per_s"]
    print(
        f"train order, cached   : {cached_rate:10.1f} records/s from memory, {cached_over_files:.2f}x the files' "
        f"(the share read in once per process, {read_in:.2f} s)",
        flush=True,
    )
    # A resume rebuilds the order at its position: the time to its first batch, at the start, the
    # middle and the end of an epoch (whole files skipped unread, at most one window read).
    resume = {}
    for share in (0.0, 0.5, 0.999):
        started = time.perf_counter()
        records = input_pipeline.train_records(
            files, counts, seed=seed, window=window, start=int(share * total), compression=compression
        )
        next(iter(records.batch(batch)))
        resume[share] = time.perf_counter() - started
    print(
        "train order, resume: first batch after "
        + ", ".join(f"{seconds:.3f} s at {share:.0%} of the epoch" for share, seconds in resume.items()),
        flush=True,
    )
    figures["resume_first_batch_seconds"] = {f"{share:g}": seconds for share, seconds in resume.items()}
    expected = sum((count / total) ** 2 for count in counts)
    ratio = figures["resumable"]["records_per_s"] / figures["buffer"]["records_per_s"]
    print(
        f"train order: resumable reads {ratio:.2f}x the buffer shuffle's records/s; a random order has {expected:.2f} "
        "of adjacent records from one file",
        flush=True,
    )
    return {
        "resumable_over_buffer_records_per_s": round(ratio, 2),
        "cached_over_files_records_per_s": round(cached_over_files, 2),
        "cache_read_in_seconds": round(read_in, 3),
        **{f"{name}_{key}": round(value, 3) for name, values in figures.items() for key, value in values.items()},
    }


def compare_training(cfg, task, resolved, manifest: dict, chosen: str, optimized: float, seconds: float) -> dict:
    """Training steps/s of the model on synthetic data in both precisions and on the real input
    (`optimized`: the input's examples/s, printed beside the synthetic rate)."""
    batch = cfg.train.global_batch_size
    spe = cfg.train.steps_per_execution if isinstance(cfg.train.steps_per_execution, int) else 4
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, spe)
    per_replica = batch // resolved.replicas

    def synthetic(context):
        return tf.data.Dataset.from_tensors(task.synthetic_batch(per_replica, manifest)).repeat()

    synthetic_rate = training_steps_per_second(
        model, resolved.strategy.distribute_datasets_from_function(synthetic), spe, seconds
    )
    print(
        f"training, synthetic data: {synthetic_rate:8.2f} steps/s (spe {spe}, {chosen}) = "
        f"{synthetic_rate * batch:.1f} examples/s; the input supplies {optimized / (synthetic_rate * batch):.2f}x that",
        flush=True,
    )
    # The same model and data in the other precision: what bfloat16 costs or gains on this machine.
    other = "float32" if chosen == "bfloat16" else "bfloat16"
    with precision.policy("mixed_bfloat16" if other == "bfloat16" else "float32"):  # restored whatever happens
        with resolved.strategy.scope():
            other_model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, spe)
        other_rate = training_steps_per_second(
            other_model, resolved.strategy.distribute_datasets_from_function(synthetic), spe, seconds
        )
    rates = {chosen: synthetic_rate, other: other_rate}
    bf16_over_f32 = rates["float32"] / rates["bfloat16"]  # step time of bfloat16 over float32's
    print(
        f"training, synthetic data: {other_rate:8.2f} steps/s in {other}; bfloat16 step time = "
        f"{bf16_over_f32:.2f}x float32's on this {resolved.kind.upper()}",
        flush=True,
    )
    real_dataset, _ = input_pipeline.distributed_dataset(
        resolved.strategy,
        cfg.data.dir,
        task,
        manifest,
        "train",
        batch,
        training=True,
        shuffle_buffer=cfg.data.shuffle_buffer,
        data_config=cfg.data,
    )
    real_rate = training_steps_per_second(model, real_dataset, spe, seconds)
    return {"synthetic": synthetic_rate, "real": real_rate, "bfloat16_over_float32": bf16_over_f32}


# ------------------------------------------------------------------ the trainer and the host's peak


class _Timer(keras.callbacks.Callback):
    """A bare fit's steps/s over the window the trainer's own figure covers (`callbacks.Report`):
    from the start of the second execution to the end of fit, the first execution (tracing,
    compilation) and the work at its end left out."""

    def __init__(self):
        super().__init__()
        self.steps, self.first_steps, self.started, self.ended = 0, None, None, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_steps is not None and self.started is None:
            self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.steps = batch + 1  # fit passes the index of the execution's last step
        if self.first_steps is None:
            self.first_steps = self.steps

    def on_train_end(self, logs=None):
        self.ended = time.perf_counter()

    def window(self) -> tuple[int, float]:
        """(steps, seconds) of the timed window."""
        return self.steps - self.first_steps, self.ended - self.started


def bare_window(cfg, task, resolved, manifest, spe: int) -> tuple[int, float]:
    """build_model + compile_model + model.fit on the trainer's input, with a timer only: the
    (steps, seconds) of its timed window."""
    keras.backend.clear_session()
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, spe)
    timer = _Timer()
    dataset = input_pipeline.training_dataset(cfg, task, resolved, manifest, seed=cfg.runtime.seed)
    model.fit(dataset, epochs=1, steps_per_epoch=cfg.train.total_steps, callbacks=[timer], verbose=0)
    return timer.window()


class TimedTrainer(Trainer):
    """The trainer, unchanged, with what each of its callbacks does at every execution boundary
    timed ({name: [(began, seconds, seconds checkpoint saves held), ...]}) and the report of its
    fit kept: what the trainer adds to a bare fit, item by item."""

    def __init__(self, cfg, task):
        super().__init__(cfg, task)
        self.calls: dict[str, list[tuple[float, float, float]]] = {}
        self.report: callbacks.Report | None = None

    def callbacks(self, *args, **kwargs):
        chosen = super().callbacks(*args, **kwargs)
        report = next(value for value in (*args, *kwargs.values()) if isinstance(value, callbacks.Report))
        for callback in chosen:
            name = type(callback).__name__
            while name in self.calls:  # two of a kind (a task's own): marked apart
                name += "'"
            _time_batch_end(callback, self.calls.setdefault(name, []), report)
        return chosen

    def fit(self, *args, **kwargs):
        self.report = super().fit(*args, **kwargs)
        return self.report


def _time_batch_end(callback, calls: list, report: callbacks.Report) -> None:
    """`callback.on_train_batch_end` records (when it began, its seconds, the seconds checkpoint
    saves held training in it) into `calls`."""
    hook = callback.on_train_batch_end

    def timed(batch, logs=None):
        held, began = sum(report.checkpoint_blocking_seconds), time.perf_counter()
        try:
            return hook(batch, logs)
        finally:
            seconds = time.perf_counter() - began
            calls.append((began, seconds, sum(report.checkpoint_blocking_seconds) - held))

    callback.on_train_batch_end = timed


@contextlib.contextmanager
def watcher_polls():
    """The metadata watcher's looks at the metadata server (in its own thread) while inside: a list
    of their seconds."""
    polls, poll = [], preemption.MetadataWatcher.poll

    def timed(self):
        began = time.perf_counter()
        try:
            return poll(self)
        finally:
            polls.append(time.perf_counter() - began)

    preemption.MetadataWatcher.poll = timed
    try:
        yield polls
    finally:
        preemption.MetadataWatcher.poll = poll


def trainer_round(cfg, task, workdir: str, round_: int) -> dict:
    """One trainer run (`make train`'s whole path) in a new run directory: its steps/s after the
    first execution (the figure it reports itself) and its metrics; each callback's seconds (and
    the seconds its checkpoint saves held) inside the timed window and at the first boundary, before
    it; from the last boundary to fit's end; what other threads did."""
    keras.backend.clear_session()
    run = replace(cfg, runtime=replace(cfg.runtime, output_dir=f"{workdir}/trainer{round_}"))
    trainer = TimedTrainer(run, task)
    with watcher_polls() as polls:
        metrics = trainer.run()
    report = trainer.report
    rate = metrics["examples_per_second"] / cfg.effective_batch_size

    def summed(keep) -> dict[str, tuple[float, float]]:
        return {
            name: (sum(call[1] for call in calls if keep(call[0])), sum(call[2] for call in calls if keep(call[0])))
            for name, calls in trainer.calls.items()
        }

    inside = summed(lambda began: report.first_time <= began <= report.end_time)
    last_hook = max(began + seconds for calls in trainer.calls.values() for began, seconds, _ in calls)
    return {
        "rate": rate,
        "metrics": metrics,
        "steps": report.step - report.first_step,
        "seconds": (report.step - report.first_step) / rate,
        "executions": max(sum(report.first_time <= call[0] for call in calls) for calls in trainer.calls.values()),
        "inside": inside,
        "first_boundary": summed(lambda began: began < report.first_time),
        "fit_end": report.end_time - last_hook,
        "written": sum(report.checkpoint_write_seconds),
        "polls": polls,
    }


ADDITIONS = {  # what each callback does at a boundary of the timed window, and at the first boundary
    "FirstExecution": ("the step reached", "the first-execution booking, the time to first step's line"),
    "NanGuard": ("a non-finite loss check", ""),
    "StepLog": (
        "every step's learning rate, the metrics and, each train.log_every, the log line, MFU, a flush",
        "the model FLOPs count, the summaries' first writes",
    ),
    "GoodputProgress": ("the run record (metrics.json), each train.log_every", ""),
    "ProfileWindow": ("runtime.profile_steps", ""),
    "Checkpoints": ("a save each train.checkpoint_every", "the background saves' set-up"),
    "Preemption": ("the SIGTERM / metadata-notice flag", ""),
    "PeriodicEvaluation": ("each train.eval_every, taken out of the window", ""),
    "EarlyStopping": ("the early-stop check", ""),
}


def describe_additions(rounds: list[dict], bare_windows: list[tuple[int, float]], asynchronous: bool) -> dict:
    """Prints what the trainer adds inside its timed window, each item the median of the rounds, the
    list's sum against the difference between the trainer's window and the bare fit's time for the
    same steps; then the first boundary's work and other threads'. Returns the JSON line's figures."""
    median = statistics.median
    steps, executions = rounds[0]["steps"], rounds[0]["executions"]
    window = median(entry["seconds"] for entry in rounds)
    bare = median(steps * seconds / bare_steps for bare_steps, seconds in bare_windows)
    items = {name: median(entry["inside"][name][0] for entry in rounds) for name in rounds[0]["inside"]}
    held = {name: median(entry["inside"][name][1] for entry in rounds) for name in rounds[0]["inside"]}
    items["fit's end"] = median(entry["fit_end"] for entry in rounds)
    print(
        f"what the trainer adds inside its timed window ({steps} steps, {executions} boundaries, from the second "
        f"execution's start to fit's end; median of {len(rounds)} rounds):",
        flush=True,
    )
    for name, seconds in items.items():
        what = ADDITIONS.get(name, ("a task's own callback", ""))[0] if name != "fit's end" else "Keras' end of fit"
        if held.get(name):
            what += f"; saves held training {held[name]:.3f} s"
            what += ", written in the background" if asynchronous else ""
        print(
            f"  {name:18s} {seconds:7.3f} s {1e3 * seconds / max(executions, 1):7.2f} ms a boundary "
            f"{seconds / window:6.2%} of the window  ({what})",
            flush=True,
        )
    listed = sum(items.values())
    print(
        f"  {'sum':18s} {listed:7.3f} s {'':18s}{listed / window:6.2%};  the trainer's window {window:.2f} s, the bare "
        f"fit's for the same steps {bare:.2f} s: {window - bare:+.3f} s",
        flush=True,
    )
    first = {name: median(entry["first_boundary"][name][0] for entry in rounds) for name in rounds[0]["first_boundary"]}
    named = [
        f"{name} {seconds:.3f} s" + (f" ({ADDITIONS[name][1]})" if ADDITIONS.get(name, ("", ""))[1] else "")
        for name, seconds in sorted(first.items(), key=lambda item: -item[1])
        if seconds >= 0.01
    ]
    polls = rounds[0]["polls"]
    print(
        f"  before it, at the first boundary (once per start): {sum(first.values()):.3f} s"
        + (f": {', '.join(named)}" if named else "")
        + f"; in other threads: checkpoint files written {median(entry['written'] for entry in rounds):.3f} s"
        + (" (while training goes on)" if asynchronous else "")
        + f", {len(polls)} metadata-server look{'s' if len(polls) != 1 else ''} {sum(polls):.3f} s",
        flush=True,
    )
    return {
        "trainer_window_seconds": round(window, 3),
        "bare_seconds_same_steps": round(bare, 3),
        "trainer_additions_seconds": {name: round(seconds, 4) for name, seconds in items.items()},
        "trainer_checkpoint_held_seconds": round(sum(held.values()), 4),
        "trainer_first_boundary_seconds": {name: round(seconds, 4) for name, seconds in first.items()},
    }


def host_peaks(cfg, resolved, seconds: float) -> dict:
    """This host's matrix-multiply peak in each precision (a CPU target only), stored for runs."""
    peaks = {}
    if resolved.kind != "cpu":
        return peaks
    for name in ("float32", "bfloat16"):
        peaks[name] = utilisation.measure_host_peak(name, seconds=seconds)
        path = utilisation.store_host_peak(cfg.runtime.cache_dir, name, peaks[name])
        print(f"host peak, {name:8s}: {peaks[name] / 1e12:7.3f} TFLOP/s ({utilisation.cpu_model()})", flush=True)
    print(f"  stored in {path}: runs on this host read their MFU against the peak of their precision", flush=True)
    return {"host_peak_tflops": {name: round(value / 1e12, 3) for name, value in peaks.items()}}


def trainer_over_bare(cfg, task, resolved, manifest: dict, rounds: int) -> dict:
    """The trainer's steps/s over a bare fit's, alternating `rounds` times, each over the same window
    (the second execution's start to fit's end); what the trainer adds inside it; the trainer's MFU."""
    spe, _ = spe_lib.choose_for(cfg, task, resolved, manifest)
    chosen = precision.choose(cfg.runtime.mixed_precision, resolved.kind).precision
    cfg = replace(
        cfg,
        train=replace(cfg.train, steps_per_execution=spe),
        runtime=replace(cfg.runtime, mixed_precision=chosen),
    )
    print(
        f"the trainer against a bare fit: {cfg.train.total_steps} steps at spe {spe}, the same model, input and "
        "precision; each timed from its second execution's start to fit's end (the trainer's own figure)",
        flush=True,
    )
    trainer_runs, bare_windows = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for round_ in range(rounds):  # which goes first alternates: neither always runs on a warmer host
            if round_ % 2:
                bare_windows.append(bare_window(cfg, task, resolved, manifest, spe))
            trainer_runs.append(trainer_round(cfg, task, workdir, round_))
            if not round_ % 2:
                bare_windows.append(bare_window(cfg, task, resolved, manifest, spe))
            print(
                f"round {round_ + 1}: trainer {trainer_runs[-1]['rate']:8.2f} steps/s, "
                f"bare model.fit {bare_windows[-1][0] / bare_windows[-1][1]:8.2f} steps/s",
                flush=True,
            )
    trainer_rates = [entry["rate"] for entry in trainer_runs]
    bare_rates = [steps / seconds for steps, seconds in bare_windows]
    ratio = statistics.median(trainer_rates) / statistics.median(bare_rates)
    additions = describe_additions(trainer_runs, bare_windows, cfg.train.async_checkpoint)
    last = trainer_runs[-1]["metrics"]
    mfu, tflops = last.get("model_flops_utilization"), last.get("tflops_per_chip")
    print(
        f"trainer/bare: {ratio:.3f} (goal >= 0.97) over {cfg.train.total_steps} steps at spe {spe}, "
        f"{cfg.runtime.mixed_precision}, {resolved.replicas} replicas; the trainer at "
        + (
            f"{tflops:.3f} TFLOP/s per chip"
            if tflops is not None
            else f"model FLOPs unknown ({last.get('model_flops_unknown')})"
        )
        + (f", MFU {mfu:.1%}" if mfu is not None else ""),
        flush=True,
    )
    return {
        "trainer_over_bare": round(ratio, 3),
        "trainer_steps_per_s": [round(rate, 2) for rate in trainer_rates],
        "bare_steps_per_s": [round(rate, 2) for rate in bare_rates],
        "trainer_tflops_per_chip": last.get("tflops_per_chip"),
        "trainer_model_flops_utilization": mfu,
        **additions,
    }


# ----------------------------------------------------------------------------- checkpoint saves


def checkpoint_bytes(path: str) -> int:
    return sum(tf.io.gfile.stat(name).length for name in tf.io.gfile.glob(f"{path}.*"))


def time_saves(model, iterator, directory: str, asynchronous: bool, saves: int, between: float) -> dict:
    """`saves` saves of `model` (its weights and optimizer state) into `directory`, each after
    `between` seconds of training, through the trainer's own `save_checkpoint`: the seconds each one
    held training and how long its files took."""
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=model.optimizer), directory, max_to_keep=2
    )
    report = callbacks.Report(step=0)
    train_function = model.make_train_function()
    for _ in range(saves):
        started = time.perf_counter()
        while time.perf_counter() - started < between:
            train_function(iterator)["loss"].numpy()
        with contextlib.redirect_stdout(io.StringIO()):  # the trainer's line per save
            callbacks.save_checkpoint(manager, int(model.optimizer.iterations.numpy()), report, asynchronous)
    manager.sync()
    return {
        "blocking": report.checkpoint_blocking_seconds,
        "write": report.checkpoint_write_seconds,
        "bytes": checkpoint_bytes(manager.latest_checkpoint),
    }


def compare_checkpoints(cfg, task, resolved, manifest: dict, where: dict[str, str], saves: int, between: float) -> dict:
    """A save's blocking seconds, synchronous against asynchronous, on each storage of `where`
    ({name: folder}), on one model of the config trained on synthetic data between saves. An
    asynchronous checkpoint pays a set-up at its first two saves (the host copy of every variable,
    then the trace of the function that refreshes it): those are shown apart from the median of
    the rest."""
    spe = cfg.train.steps_per_execution if isinstance(cfg.train.steps_per_execution, int) else 4
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, spe)
        per_replica = cfg.train.global_batch_size // resolved.replicas
        synthetic = resolved.strategy.distribute_datasets_from_function(
            lambda context: tf.data.Dataset.from_tensors(task.synthetic_batch(per_replica, manifest)).repeat()
        )
        iterator = iter(synthetic)
        model.make_train_function()(iterator)["loss"].numpy()  # compiled before anything is timed
        figures = {}
        for name, folder in where.items():
            timed = {
                mode: time_saves(model, iterator, f"{folder}/{mode}", mode == "asynchronous", saves, between)
                for mode in ("synchronous", "asynchronous")
            }
            synchronous = statistics.median(timed["synchronous"]["blocking"])
            asynchronous = statistics.median(timed["asynchronous"]["blocking"][2:])
            first = timed["asynchronous"]["blocking"][:2]
            ratio = synchronous / asynchronous if asynchronous > 0 else float("inf")
            megabytes = timed["synchronous"]["bytes"] / 1e6
            print(
                f"checkpoint, {name}: {megabytes:.1f} MB; a save held training {synchronous:.3f} s synchronous, "
                f"{asynchronous:.4f} s written in the background ({ratio:.1f}x less; its first two saves "
                f"{first[0]:.3f} s, {first[1]:.3f} s: the host copy, then its copy function traced); "
                f"a background save's files took {statistics.median(timed['asynchronous']['write'][2:]):.3f} s "
                f"(a save after {between:.2f} s of training each)",
                flush=True,
            )
            figures[name] = {
                "megabytes": round(megabytes, 2),
                "synchronous_seconds": round(synchronous, 4),
                "asynchronous_seconds": round(asynchronous, 4),
                "asynchronous_first_two_seconds": [round(value, 4) for value in first],
                "synchronous_over_asynchronous": round(ratio, 1),
                "asynchronous_write_seconds": round(statistics.median(timed["asynchronous"]["write"][2:]), 4),
            }
    return {"checkpoint_blocking": figures}


def checkpoint_comparison(cfg, task, resolved, manifest: dict, args) -> dict:
    """`compare_checkpoints` on a temporary local folder and, with --gcs, on a new folder under it;
    both removed afterwards."""
    if args.saves < 3:
        raise UserError(
            f"--saves must be at least 3 (the first two set up the background saves, the rest are timed), "
            f"got {args.saves}"
        )
    if args.gcs and not args.gcs.startswith("gs://"):
        raise UserError(f"--gcs must be a gs:// folder, got {args.gcs!r}")
    gcp.require_credentials({"--gcs": args.gcs or None})
    remote = f"{args.gcs.rstrip('/')}/bench-checkpoints-{uuid.uuid4().hex[:8]}" if args.gcs else ""
    with tempfile.TemporaryDirectory() as local:
        where = {"local disk": local, **({"gs://": remote} if remote else {})}
        try:
            return compare_checkpoints(cfg, task, resolved, manifest, where, args.saves, between=args.seconds)
        finally:
            if remote and tf.io.gfile.exists(remote):
                tf.io.gfile.rmtree(remote)


PARTS = ("input", "peak", "trainer", "checkpoints")


def parts_of(value: str) -> tuple[str, ...]:
    """--only's comma-separated parts, each one of PARTS; all of them for ''."""
    chosen = tuple(part.strip() for part in value.split(",") if part.strip()) or PARTS
    unknown = [part for part in chosen if part not in PARTS]
    if unknown:
        raise UserError(f"--only takes a comma-separated list of {', '.join(PARTS)}; got {', '.join(unknown)}")
    return chosen


def input_part(cfg, task, resolved, manifest: dict, chosen: str, seconds: float) -> dict:
    """The input against a naive one, the train orders, training on synthetic and real data."""
    files, counts = input_pipeline.split_files(cfg.data.dir, manifest, "train")
    batch = cfg.train.global_batch_size
    train = manifest["splits"]["train"]
    bytes_per_example = train["bytes"] / max(train["num_examples"], 1)
    print(
        f"input: {len(files)} train shards, global batch {batch} over {resolved.replicas} replicas, "
        f"{task.describe_data(manifest)}, {bytes_per_example:,.0f} bytes per example",
        flush=True,
    )
    optimized, naive = compare_inputs(cfg, task, resolved, manifest, files, counts, seconds)
    orders = compare_orders(cfg, manifest, files, counts, seconds)
    training = compare_training(cfg, task, resolved, manifest, chosen, optimized, seconds)
    synthetic_rate, real_rate = training["synthetic"], training["real"]
    input_bound = real_rate < INPUT_BOUND_MARGIN * synthetic_rate
    print(
        f"training, real data     : {real_rate:8.2f} steps/s -> "
        + (
            "INPUT-BOUND: speed up the input (more shards, larger interleave, cache)"
            if input_bound
            else "not input-bound"
        ),
        flush=True,
    )
    return {
        "bytes_per_example": round(bytes_per_example),
        "train_shards": len(files),
        "optimized_examples_per_s": round(optimized, 1),
        "naive_examples_per_s": round(naive, 1),
        "speedup": round(optimized / naive, 2),
        "train_steps_per_s_synthetic": round(synthetic_rate, 2),
        "train_steps_per_s_real": round(real_rate, 2),
        "input_over_synthetic_training": round(optimized / (synthetic_rate * batch), 2),
        "precision": chosen,
        "bfloat16_over_float32_step_time": round(training["bfloat16_over_float32"], 2),
        "input_bound": input_bound,
        **orders,
    }


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = config_lib.command_line(
        __doc__.split("\n\n")[0],
        argv,
        lambda parser: (
            parser.add_argument("--seconds", type=float, default=3.0, help="minimum time per measurement"),
            parser.add_argument("--rounds", type=int, default=2, help="trainer and bare-fit runs, alternating"),
            parser.add_argument(
                "--gcs", default="", help="a gs:// folder to time checkpoint saves on too (written, then deleted)"
            ),
            parser.add_argument("--saves", type=int, default=5, help="checkpoint saves per storage and kind"),
            parser.add_argument(
                "--only",
                default="",
                help=f"comma-separated parts to run, of {','.join(PARTS)} (default: all); after the dotted keys",
            ),
        ),
        registry=tasks,
    )
    parts = parts_of(args.only)
    if args.rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {args.rounds}")
    task = tasks.load(cfg.task)
    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(cfg.data.dir, task, cfg.data)
    resolved.per_replica_batch_size(cfg.train.global_batch_size)
    chosen = precision.apply(cfg.runtime.mixed_precision, resolved.kind)
    print(f"precision {chosen.describe()}", flush=True)
    figures = {}
    # Out of device memory in a part that trains the model: training's one line, with the precision that runs.
    ran = replace(cfg, runtime=replace(cfg.runtime, mixed_precision=chosen.precision))
    with levers.out_of_memory_reported(ran, task, manifest, resolved):
        if "input" in parts:
            figures.update(input_part(cfg, task, resolved, manifest, chosen.precision, args.seconds))
        if "peak" in parts:
            figures.update(host_peaks(cfg, resolved, args.seconds))
        if "trainer" in parts:
            figures.update(trainer_over_bare(cfg, task, resolved, manifest, args.rounds))
        if "checkpoints" in parts:
            figures.update(checkpoint_comparison(cfg, task, resolved, manifest, args))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
