"""The tf.data input: manifest check, per-host sharding, parallel reads, batched parsing.

On a Pod slice every host runs its own input pipeline (`distribute_datasets_from_function`
calls `dataset_fn` once per host with its `input_pipeline_id`). Each pipeline reads a disjoint
set of shard files, so every example is read once per epoch across the slice; when there are
fewer files than pipelines it falls back to reading every record and keeping 1 in N, which
works but makes every host read all the data (a warning says so: write more shards).

Training reads its share in an order that is a function of (seed, position) alone, so that a
resumed run rebuilds the input at the step it stopped and sees exactly what an uninterrupted run
would (`train_records`): each epoch's file order is a stateless permutation of (seed, epoch), the
files are read one after another, and each window of `data.shuffle_buffer` consecutive records is
permuted by a stateless shuffle of (seed, epoch, window). A resume skips whole files by the
manifest's record counts without reading them, and reads at most one window of one file to find
its place. Then: batching to the per-replica batch with drop_remainder=True (the TPU compiles one
program for one static shape), one vectorised parse per batch in order, and prefetch so the host
prepares the next batches while the device computes. Evaluation reads in file order. A resume on
another number of hosts first reads the old hosts' unread records of their epoch, handed out in
pieces (`Piece`, `train_stream`; input_cursor.py decides who reads what).

Evaluation must count every example exactly once while keeping static shapes: each pipeline
pads its split with weight-0 examples to a whole number of global steps.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import tensorflow as tf

from .errors import UserError

log = logging.getLogger(__name__)
AUTOTUNE = tf.data.AUTOTUNE
MANIFEST = "manifest.json"

# Why autotuning is off. Deleting a tf.data iterator whose autotuning thread (Model::OptimizeLoop)
# is running can block for up to 60 s in TensorFlow 2.20: the iterator's CancellationManager wakes
# the thread from a callback but marks itself cancelled only after all callbacks ran, so the thread
# can see "not cancelled", sleep out its optimisation period (which doubles up to 60 s as a run
# goes on) and the iterator's destructor joins it. A distributed iterator holds one such iterator
# per replica (the MultiDeviceIterator's device prefetch) besides the host's, and each loses that
# race independently: with 8 replicas, minutes idle whenever model.fit or evaluate returns. With
# autotuning off there is no such thread; AUTOTUNE then means a fixed default (parallel calls =
# cycle length or CPU cores, prefetch's own buffer growth). `make bench` measures the pipeline.
NO_AUTOTUNE = tf.data.Options()
NO_AUTOTUNE.autotune.enabled = False


def _untuned_device_prefetch() -> None:
    """Turns autotuning off on the per-replica datasets that MultiDeviceIterator builds: no public
    option reaches them (they only prefetch a fixed buffer to each device, nothing to tune)."""
    from tensorflow.python.data.ops import multi_device_iterator_ops as mdi  # private API of TF 2.20

    create = getattr(mdi, "_create_device_dataset", None)
    if create is None or getattr(create, "untuned", False):
        return

    def untuned(*args, **kwargs):
        return create(*args, **kwargs).with_options(NO_AUTOTUNE)

    untuned.untuned = True
    mdi._create_device_dataset = untuned


def read_manifest(data_dir: str, task, data=None) -> dict:
    """Reads and checks DATA_DIR/manifest.json against `task`'s code and the `data` config section;
    one clear error when it cannot be used."""
    path = f"{data_dir.rstrip('/')}/{MANIFEST}"
    if not tf.io.gfile.exists(path):
        raise UserError(
            f"no {MANIFEST} in {data_dir}: the data has not been preprocessed there; "
            f"run `make preprocess` (DATA_DIR={data_dir}) or set data.dir"
        )
    try:
        with tf.io.gfile.GFile(path) as handle:
            manifest = json.load(handle)
    except json.JSONDecodeError:
        raise UserError(f"{path} is not valid JSON (an interrupted write?); re-run `make preprocess`") from None
    if manifest.get("task", task.name) != task.name:
        raise UserError(
            f"{path} was written for the task {manifest['task']!r}, not {task.name!r}; "
            "point data.dir at this project's data or re-run `make preprocess`"
        )
    # The spec this code would write for the manifest's own settings (the task's data keys): a
    # difference means other code wrote the shards.
    own = dataclasses.replace(
        task.data_config(),
        **{key: manifest[key] for key in (f.name for f in dataclasses.fields(task.data_config)) if key in manifest},
    )
    if manifest.get("feature_spec") != task.feature_spec(own):
        raise UserError(
            f"the feature spec in {path} differs from this code's; the shards were written by "
            "another version of the preprocessing: re-run `make preprocess`"
        )
    if data is not None:
        task.check_manifest(manifest, data, data_dir)
    for split in ("train", "eval"):
        if manifest["splits"].get(split, {}).get("num_examples", 0) == 0:
            raise UserError(
                f"{path} lists no {split} examples; check the raw data "
                f"({manifest.get('source')}) and re-run `make preprocess`"
            )
    return manifest


def split_files(data_dir: str, manifest: dict, split: str) -> tuple[list[str], list[int]]:
    info = manifest["splits"][split]
    return [f"{data_dir.rstrip('/')}/{name}" for name in info["files"]], list(info["examples_per_file"])


def _pipeline_example_counts(examples_per_file: list[int], num_pipelines: int) -> list[int]:
    """Examples each pipeline reads, with file-level sharding or the record-level fallback."""
    total = sum(examples_per_file)
    if len(examples_per_file) >= num_pipelines:
        return [sum(examples_per_file[i::num_pipelines]) for i in range(num_pipelines)]
    return [len(range(i, total, num_pipelines)) for i in range(num_pipelines)]


def eval_steps(examples_per_file: list[int], global_batch_size: int, num_pipelines: int) -> int:
    """Global steps that cover every eval example once, padding the shorter pipelines."""
    per_pipeline_batch = global_batch_size // num_pipelines
    return math.ceil(max(_pipeline_example_counts(examples_per_file, num_pipelines)) / per_pipeline_batch)


def _records(paths, compression: str) -> tf.data.Dataset:
    return tf.data.TFRecordDataset(
        paths, compression_type="GZIP" if compression == "gzip" else "", buffer_size=8 * 2**20
    )


# data.cache=auto: a host keeps a split's records in memory, read once, when its share fits the
# smaller of a quarter of the host's available memory and 1 GiB (tf.data holds them as a constant
# of its graph). Reading from memory skips the storage reads of every later epoch and evaluation
# (a gs:// split is downloaded once per process); the order, and so exact resume, is unchanged.
CACHE_LIMIT_BYTES = 2**30


def cache_budget() -> int:
    try:
        with open("/proc/meminfo") as handle:
            available = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 0
    return min(CACHE_LIMIT_BYTES, available // 4)


_TABLES: dict = {}  # the record tables of this process, by (files, compression)


class RecordTable:
    """Every record of `files`, read once into host memory: a [file, record] string tensor. The
    same files (an evaluation after another) are read once per process."""

    def __new__(cls, files: list[str], compression: str):
        key = (tuple(files), compression)
        if key not in _TABLES:
            table = super().__new__(cls)
            rows = [list(_records(path, compression).as_numpy_iterator()) for path in files]
            flat = [record for row in rows for record in row]
            table.table = tf.RaggedTensor.from_row_lengths(
                tf.constant(flat, tf.string, shape=[len(flat)]), [len(row) for row in rows]
            )
            _TABLES[key] = table
        return _TABLES[key]

    def records(self, order) -> tf.data.Dataset:
        """The records of the files at `order` (indices into `files`), one file after another."""
        return tf.data.Dataset.from_tensor_slices(tf.gather(self.table, order).flat_values)

    def file(self, index) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.table[index])


def cached(split_bytes: float, share: float, cache: str) -> bool:
    """Whether a pipeline keeps its `share` of a split of `split_bytes` in memory (data.cache)."""
    return cache == "auto" and split_bytes * share <= cache_budget()


def file_order(count: int, seed: int, epoch) -> tf.Tensor:
    """The order in which a pipeline reads its `count` files in `epoch`: a stateless permutation of
    (seed, epoch), the same in the graph and when a resume computes it."""
    seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64), seed=seeds)


def _window_shuffled(records: tf.data.Dataset, seed: int, epoch, first_window: int, window: int) -> tf.data.Dataset:
    """`records` (from a window boundary of `epoch`) with each window of `window` records permuted by a
    stateless shuffle of (seed, epoch, window index)."""

    def permute(index, batch):
        seeds = tf.stack([tf.constant(seed + 1_000_003, tf.int64), tf.cast(epoch, tf.int64) * 2**32 + index])
        order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(batch, tf.int64)[0]), seed=seeds)
        return tf.gather(batch, order)

    return records.batch(window).enumerate(start=first_window).map(permute).unbatch()


@dataclasses.dataclass(frozen=True)
class Share:
    """What one pipeline reads of a split: its files, their record counts, and which records of the
    stream they make it keeps (every `stride`-th from `phase`: the record-level fallback)."""

    files: list[str]
    counts: list[int]
    stride: int
    phase: int

    @staticmethod
    def of(files: list[str], counts: list[int], pipeline_id: int, num_pipelines: int) -> "Share":
        if num_pipelines > 1 and len(files) >= num_pipelines:  # file-level sharding
            return Share(files[pipeline_id::num_pipelines], counts[pipeline_id::num_pipelines], 1, 0)
        return Share(list(files), list(counts), num_pipelines, pipeline_id)

    @property
    def total(self) -> int:
        """Records of one epoch's stream (all of the share's files)."""
        return sum(self.counts)

    def epoch_of(self, kept: int) -> int:
        """The epoch of the pipeline's `kept`-th record (counted from the order's start)."""
        return (kept * self.stride + self.phase) // self.total

    def epoch_start(self, epoch: int) -> int:
        """The index of the pipeline's first record of `epoch`: the ceiling of (epoch x total - phase) /
        stride, which is 0 for epoch 0 (the phase is less than the stride)."""
        return -(-(epoch * self.total - self.phase) // self.stride)


@dataclasses.dataclass(frozen=True)
class Piece:
    """`count` records of another layout's train order, left unread when that layout stopped: the
    stream of pipeline `pipeline_id` of `num_pipelines` in the order seeded `seed`, from its `start`-th
    record (`train_records`). A resume on another number of input pipelines hands each new pipeline
    its pieces of what the old ones had not read of their epoch (input_cursor.py)."""

    seed: int
    num_pipelines: int
    pipeline_id: int
    start: int
    count: int

    def records(self, files: list[str], counts: list[int], window: int, compression: str) -> tf.data.Dataset:
        return train_records(
            files,
            counts,
            seed=self.seed,
            window=window,
            pipeline_id=self.pipeline_id,
            num_pipelines=self.num_pipelines,
            start=self.start,
            compression=compression,
        ).take(self.count)


def train_records(
    files: list[str],
    examples_per_file: list[int],
    *,
    seed: int,
    window: int,
    pipeline_id: int = 0,
    num_pipelines: int = 1,
    start: int = 0,
    compression: str = "none",
    cache: bool = False,
) -> tf.data.Dataset:
    """One pipeline's train records, epoch after epoch, in the resumable order, from its `start`-th.

    The stream of an epoch is every file of the share in `file_order(seed, epoch)`, read one after
    another, each window of `window` records permuted (`_window_shuffled`); the pipeline keeps its
    records of it (all of them with file-level sharding). Record `start` is found by arithmetic on
    the manifest's counts: whole files are skipped unread, and only the window it falls in is read
    from its start. With `cache` the share's records are read once into memory (`RecordTable`) and
    every epoch is taken from there, in the same order.
    """
    share = Share.of(files, examples_per_file, pipeline_id, num_pipelines)
    total = sum(share.counts)
    if total == 0:
        raise UserError(
            f"input pipeline {pipeline_id} of {num_pipelines} has no train records in its {len(share.files)} files; "
            "write more shards (preprocess --num_shards) or use fewer hosts"
        )
    paths = tf.constant(share.files)
    position = start * share.stride + share.phase  # in the share's stream of all records
    epoch, offset = divmod(position, total)
    window_start = offset // window * window
    order = file_order(len(share.files), seed, epoch).numpy().tolist()
    first = before = 0  # whole files before the window start: skipped unread (window_start < total)
    while before + share.counts[order[first]] <= window_start:
        before += share.counts[order[first]]
        first += 1
    if cache:
        table = RecordTable(share.files, compression)
        read = table.records
        opened = read(tf.constant(order[first:], tf.int64))
    else:
        read = lambda order: _records(tf.gather(paths, order), compression)  # noqa: E731
        opened = _records([share.files[index] for index in order[first:]], compression)
    opened = opened.skip(window_start - before)
    current = _window_shuffled(opened, seed, epoch, window_start // window, window).skip(offset - window_start)
    later = tf.data.Dataset.range(epoch + 1, 2**62).flat_map(
        lambda e: _window_shuffled(read(file_order(len(share.files), seed, e)), seed, e, 0, window)
    )
    stream = current.concatenate(later)
    return stream.shard(share.stride, 0) if share.stride > 1 else stream


def train_stream(
    files: list[str],
    examples_per_file: list[int],
    *,
    seed: int,
    window: int,
    pipeline_id: int,
    num_pipelines: int,
    consumed: int,
    first_epoch: int,
    pending: tuple[Piece, ...],
    compression: str,
    cache: bool,
) -> tf.data.Dataset:
    """One pipeline's train records after its first `consumed` since the order began: the `pending`
    pieces (another layout's unread records of the epoch it stopped in), then its own stream
    (`train_records`) from the start of `first_epoch`. Without pending pieces and from epoch 0 this
    is `train_records` from `consumed`."""
    share = Share.of(files, examples_per_file, pipeline_id, num_pipelines)
    own = share.epoch_start(first_epoch) if share.total else 0
    left = consumed
    parts = []
    for piece in pending:
        if left < piece.count:
            parts.append(dataclasses.replace(piece, start=piece.start + left, count=piece.count - left))
        left = max(0, left - piece.count)
    stream = train_records(
        files,
        examples_per_file,
        seed=seed,
        window=window,
        pipeline_id=pipeline_id,
        num_pipelines=num_pipelines,
        start=own + left,
        compression=compression,
        cache=cache,
    )
    for piece in reversed(parts):
        stream = piece.records(files, examples_per_file, window, compression).concatenate(stream)
    return stream


def batch_key(seed: int, pipeline_id: int, index, from_step: int) -> tf.Tensor:
    """The stateless-RNG key of a pipeline's `index`-th train batch of the order seeded `seed` that
    began at the run's step `from_step`: an int64 [2] tensor, a function of the position in the run
    alone (`Task.parse_batch`'s `seed`). An order that begins later (a resume on another layout, which
    counts its batches from 0 again) keys from another stream: no earlier order's key comes back."""
    return tf.stack(
        [
            tf.constant(seed, tf.int64) + tf.constant(from_step, tf.int64) * 2**32,
            tf.constant(pipeline_id, tf.int64) * 2**40 + index,
        ]
    )


def _warn_record_level(files: list[str], num_pipelines: int) -> bool:
    """Whether the pipelines share the files record by record (fewer files than pipelines), said once
    per pipeline in a warning."""
    record_level = num_pipelines > 1 and len(files) < num_pipelines
    if record_level:
        log.warning(
            "%d shard files for %d input pipelines: every host reads all files and keeps 1 record in %d; "
            "write at least %d shards (preprocess --num_shards) for file-level sharding",
            len(files),
            num_pipelines,
            num_pipelines,
            num_pipelines,
        )
    return record_level


def train_pipeline(
    files: list[str],
    examples_per_file: list[int],
    task,
    manifest: dict,
    batch_size: int,
    *,
    seed: int,
    shuffle_buffer: int = 2048,
    pipeline_id: int = 0,
    num_pipelines: int = 1,
    compression: str = "none",
    accumulation_steps: int = 1,
    start: int = 0,
    first_epoch: int = 0,
    pending: tuple[Piece, ...] = (),
    cache: bool = False,
    data_config=None,
    from_step: int = 0,
) -> tf.data.Dataset:
    """One host's train input: batches of `batch_size` (per replica) parsed by `task` with the run's
    `data_config` (the config's `data` section: `Task.parse_batch` reads its run-time keys), repeated
    forever from `start` (the records this pipeline consumed before: see `train_stream`, which also
    says what `first_epoch` and `pending` are), in the resumable order of `seed`, which must be the
    same on every host. With `accumulation_steps` > 1, each element is the [k, batch, ...]
    micro-batches of one optimizer update. The order began at the run's step `from_step` (its batches'
    keys: `batch_key`)."""
    _warn_record_level(files, num_pipelines)
    dataset = train_stream(
        files,
        examples_per_file,
        seed=seed,
        window=shuffle_buffer,
        pipeline_id=pipeline_id,
        num_pipelines=num_pipelines,
        consumed=start,
        first_epoch=first_epoch,
        pending=pending,
        compression=compression,
        cache=cache,
    ).batch(batch_size, drop_remainder=True)
    # Each batch's random draws (augmentation) are keyed by its place in the run (the order and its
    # place in it): a resumed input hands the same batch the same key, so it draws what the
    # uninterrupted run drew, and a later order never draws an earlier one's.
    keys = tf.data.Dataset.range(start // batch_size, 2**62).map(
        lambda index: batch_key(seed, pipeline_id, index, from_step)
    )
    dataset = tf.data.Dataset.zip(dataset, keys).map(
        lambda batch, key: task.parse_batch(batch, manifest, training=True, seed=key, data_config=data_config),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,  # the order is the resumable one
    )
    if accumulation_steps > 1:  # [k, batch, ...]: the k micro-batches of one optimizer update
        dataset = dataset.batch(accumulation_steps, drop_remainder=True)
    return dataset.prefetch(AUTOTUNE).with_options(NO_AUTOTUNE)


def eval_pipeline(
    files: list[str],
    examples_per_file: list[int],
    task,
    manifest: dict,
    batch_size: int,
    *,
    pipeline_id: int = 0,
    num_pipelines: int = 1,
    replicas_per_pipeline: int = 1,
    global_batch_size: int | None = None,
    compression: str = "none",
    cache: bool = False,
    data_config=None,
) -> tf.data.Dataset:
    """One host's eval input: one pass in file order, padded with weight-0 examples to the steps
    that cover every pipeline's share (`eval_steps` of `global_batch_size`, by default `batch_size`
    x the replicas), yielding (features, targets, weights) parsed by `task` with `data_config`."""
    record_level = _warn_record_level(files, num_pipelines)
    mine = files[pipeline_id::num_pipelines] if num_pipelines > 1 and not record_level else files
    if cache:
        table = RecordTable(mine, compression)
        dataset, read = tf.data.Dataset.range(len(mine)), table.file
    else:
        dataset, read = tf.data.Dataset.from_tensor_slices(mine), lambda path: _records(path, compression)
    dataset = dataset.interleave(
        read,
        cycle_length=max(1, min(len(files), 16)),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,  # record-level sharding needs the same order everywhere
    )
    if record_level:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    steps = eval_steps(
        examples_per_file, global_batch_size or batch_size * num_pipelines * replicas_per_pipeline, num_pipelines
    )
    padded = tf.data.Dataset.from_tensors((tf.constant(task.padding_record(manifest)), 0.0)).repeat()
    dataset = (
        dataset.map(lambda record: (record, 1.0))
        .concatenate(padded)
        .take(steps * batch_size * replicas_per_pipeline)
        .batch(batch_size, drop_remainder=True)
    )
    dataset = dataset.map(
        lambda batch, weights: (*task.parse_batch(batch, manifest, training=False, data_config=data_config), weights),
        num_parallel_calls=AUTOTUNE,
    )
    return dataset.prefetch(AUTOTUNE).with_options(NO_AUTOTUNE)


def distributed_dataset(
    strategy: tf.distribute.Strategy,
    data_dir: str,
    task,
    manifest: dict,
    split: str,
    global_batch_size: int,
    *,
    training: bool,
    seed: int = 0,
    shuffle_buffer: int = 2048,
    accumulation_steps: int = 1,
    start_step: int = 0,
    first_epoch: int = 0,
    pending: tuple[tuple[Piece, ...], ...] = (),
    cache: str = "none",
    data_config=None,
    from_step: int = 0,
):
    """(the per-host datasets of `split` distributed over `strategy`'s replicas, the number of
    global steps of one evaluation pass or None when training). Training starts where `start_step`
    steps of this order have consumed (each pipeline's share of them), at the run's step
    `from_step` + `start_step` (the order began at `from_step`); `pending` holds each pipeline's
    pieces of an earlier layout's epoch (`train_stream`). `cache` is data.cache; `data_config` the
    run's data section, which `Task.parse_batch` is given."""
    files, examples_per_file = split_files(data_dir, manifest, split)
    split_bytes = manifest["splits"][split].get("bytes", math.inf)  # unknown size: never cached
    num_pipelines = []

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        num_pipelines.append(context.num_input_pipelines)
        per_replica = context.get_per_replica_batch_size(global_batch_size)
        replicas_per_pipeline = context.num_replicas_in_sync // context.num_input_pipelines
        shared = dict(
            pipeline_id=context.input_pipeline_id,
            num_pipelines=context.num_input_pipelines,
            compression=manifest.get("compression", "none"),
            cache=cached(split_bytes, 1 / context.num_input_pipelines, cache),
            data_config=data_config,
        )
        if not training:
            return eval_pipeline(
                files,
                examples_per_file,
                task,
                manifest,
                per_replica,
                replicas_per_pipeline=replicas_per_pipeline,
                global_batch_size=global_batch_size,
                **shared,
            )
        return train_pipeline(
            files,
            examples_per_file,
            task,
            manifest,
            per_replica,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            accumulation_steps=accumulation_steps,
            start=start_step * per_replica * accumulation_steps * replicas_per_pipeline,
            first_epoch=first_epoch,
            pending=pending[context.input_pipeline_id] if pending else (),
            from_step=from_step,
            **shared,
        )

    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    _untuned_device_prefetch()
    dataset = strategy.distribute_datasets_from_function(dataset_fn, options)
    steps = None if training else eval_steps(examples_per_file, global_batch_size, num_pipelines[0])
    return dataset, steps


def training_dataset(
    cfg, task, target, manifest: dict, seed: int, start_step: int = 0, first_epoch: int = 0, pending=(), from_step=0
):
    """The train split in the resumable order of `seed`, `start_step` steps into it, distributed over
    the replicas of `target` (a resolved distribute.Target); `first_epoch`, `pending` and `from_step`
    (the run's step the order began at) as an input_cursor.Order holds them."""
    dataset, _ = distributed_dataset(
        target.strategy,
        cfg.data.dir,
        task,
        manifest,
        "train",
        cfg.train.global_batch_size,
        training=True,
        seed=seed,
        shuffle_buffer=cfg.data.shuffle_buffer,
        accumulation_steps=cfg.train.gradient_accumulation_steps,
        start_step=start_step,
        first_epoch=first_epoch,
        pending=pending,
        cache=cfg.data.cache,
        data_config=cfg.data,
        from_step=from_step,
    )
    return dataset
