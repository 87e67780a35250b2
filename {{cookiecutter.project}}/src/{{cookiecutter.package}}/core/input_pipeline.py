"""The tf.data input: manifest check, per-host sharding, parallel reads, batched parsing.

On a Pod slice every host runs its own input pipeline (`distribute_datasets_from_function`
calls `dataset_fn` once per host with its `input_pipeline_id`). Each pipeline reads a disjoint
set of shard files, so every example is read once per epoch across the slice; when there are
fewer files than pipelines it falls back to reading every record and keeping 1 in N, which
works but makes every host read all the data (a warning says so: write more shards).

Then: interleaved parallel reads, a shuffle buffer (training), batching to the per-replica
batch with drop_remainder=True (the TPU compiles one program for one static shape), one
vectorised parse per batch, and prefetch so the host prepares the next batches while the
device computes. Training order is non-deterministic (faster); evaluation order is not.

Evaluation must count every example exactly once while keeping static shapes: each pipeline
pads its split with weight-0 examples to a whole number of global steps.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import tensorflow as tf

from .. import tasks
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


def read_manifest(data_dir: str, data=None) -> dict:
    """Reads and checks DATA_DIR/manifest.json against this code and the `data` config section;
    one clear error when it cannot be used."""
    task = tasks.current()
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


def make_dataset(
    files: list[str],
    examples_per_file: list[int],
    manifest: dict,
    batch_size: int,
    *,
    training: bool,
    pipeline_id: int = 0,
    num_pipelines: int = 1,
    replicas_per_pipeline: int = 1,
    compression: str = "none",
    seed: int = 0,
    shuffle_buffer: int = 2048,
    global_batch_size: int | None = None,
    accumulation_steps: int = 1,
) -> tf.data.Dataset:
    """One host's input. `batch_size` is per replica; training repeats forever, evaluation is one
    padded pass yielding (features, labels, weights). `seed` must be the same on every host."""
    task = tasks.current()
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
    deterministic = not training or record_level  # record-level sharding needs the same order everywhere
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if num_pipelines > 1 and not record_level:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    if training:
        dataset = dataset.shuffle(len(files), seed=seed).repeat()
    dataset = dataset.interleave(
        lambda path: tf.data.TFRecordDataset(
            path, compression_type="GZIP" if compression == "gzip" else "", buffer_size=8 * 2**20
        ),
        cycle_length=max(1, min(len(files), 16)),
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )
    if record_level:
        dataset = dataset.shard(num_pipelines, pipeline_id)

    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed + pipeline_id).batch(batch_size, drop_remainder=True)
        dataset = dataset.map(
            lambda batch: task.parse_batch(batch, manifest, training=True),
            num_parallel_calls=AUTOTUNE,
            deterministic=False,
        )
        if accumulation_steps > 1:  # [k, batch, ...]: the k micro-batches of one optimizer update
            dataset = dataset.batch(accumulation_steps, drop_remainder=True)
    else:
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
            lambda batch, weights: (*task.parse_batch(batch, manifest, training=False), weights),
            num_parallel_calls=AUTOTUNE,
        )
    return dataset.prefetch(AUTOTUNE).with_options(NO_AUTOTUNE)


def distributed_dataset(
    strategy: tf.distribute.Strategy,
    data_dir: str,
    manifest: dict,
    split: str,
    global_batch_size: int,
    *,
    training: bool,
    seed: int = 0,
    shuffle_buffer: int = 2048,
    accumulation_steps: int = 1,
):
    """(the per-host datasets of `split` distributed over `strategy`'s replicas, the number of
    global steps of one evaluation pass or None when training)."""
    files, examples_per_file = split_files(data_dir, manifest, split)
    num_pipelines = []

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        num_pipelines.append(context.num_input_pipelines)
        return make_dataset(
            files,
            examples_per_file,
            manifest,
            context.get_per_replica_batch_size(global_batch_size),
            training=training,
            pipeline_id=context.input_pipeline_id,
            num_pipelines=context.num_input_pipelines,
            replicas_per_pipeline=context.num_replicas_in_sync // context.num_input_pipelines,
            compression=manifest.get("compression", "none"),
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            global_batch_size=global_batch_size,
            accumulation_steps=accumulation_steps if training else 1,
        )

    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    _untuned_device_prefetch()
    dataset = strategy.distribute_datasets_from_function(dataset_fn, options)
    steps = None if training else eval_steps(examples_per_file, global_batch_size, num_pipelines[0])
    return dataset, steps
