"""Is training input-bound? The input pipeline against a naive one, and training on real data
against training on synthetic data already in memory, all measured in this one run.

    make bench            # python -m {{ cookiecutter.package }}.bench_input --config configs/local.yaml

- optimized: input_pipeline.make_dataset (interleaved reads, batched vectorised parse, prefetch)
- naive: one file after another, parse one example at a time, no parallelism, no prefetch
- training steps/s on synthetic data (the ceiling the input must keep up with) and on real data.
If real-data training is more than 10% slower than synthetic, the input is the bottleneck.
The last line is JSON.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Sequence

import tensorflow as tf

from . import config as config_lib
from . import distribute, features, input_pipeline
from . import steps_per_execution as spe_lib
from .errors import run_cli
from .model import build_model, compile_model, set_precision

INPUT_BOUND_MARGIN = 0.9


def examples_per_second(dataset: tf.data.Dataset, batch_size: int, min_seconds: float) -> float:
    iterator = iter(dataset)
    next(iterator)  # start the pipeline (threads, first file opens)
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < min_seconds or batches < 5:
        next(iterator)
        batches += 1
    return batches * batch_size / (time.perf_counter() - started)


def naive_dataset(files: list[str], image_size: int, batch_size: int, compression: str) -> tf.data.Dataset:
    """What a first version often looks like: sequential reads, per-example parsing, no prefetch."""
    def parse_one(record):
        images, labels = features.parse_batch(tf.expand_dims(record, 0), image_size)
        return images[0], labels[0]

    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.map_parallelization = False
    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP" if compression == "gzip" else "")
    return dataset.repeat().map(parse_one).batch(batch_size, drop_remainder=True).with_options(options)


def training_steps_per_second(model, dataset, steps_per_execution: int, min_seconds: float) -> float:
    return spe_lib.measure(model, iter(dataset), steps_per_execution, min_seconds).steps_per_second


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = config_lib.command_line(__doc__.split("\n\n")[0], argv, lambda parser: parser.add_argument(
        "--seconds", type=float, default=3.0, help="minimum time per measurement"))
    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(cfg.data.dir, cfg.data.image_size)
    resolved.per_replica_batch_size(cfg.train.global_batch_size)
    set_precision(cfg.runtime.mixed_precision)
    files, counts = input_pipeline.split_files(cfg.data.dir, manifest, "train")
    size, batch, compression = manifest["image_size"], cfg.train.global_batch_size, manifest.get("compression", "none")
    print(f"{resolved.describe()}; {len(files)} train shards, global batch {batch}, {size}px", flush=True)

    optimized = examples_per_second(
        input_pipeline.make_dataset(files, counts, size, batch, training=True, compression=compression,
                                    shuffle_buffer=cfg.data.shuffle_buffer), batch, args.seconds)
    print(f"input, optimized : {optimized:10.1f} examples/s", flush=True)
    naive = examples_per_second(naive_dataset(files, size, batch, compression), batch, args.seconds)
    print(f"input, naive     : {naive:10.1f} examples/s   speedup {optimized / naive:.2f}x", flush=True)

    spe = cfg.train.steps_per_execution if isinstance(cfg.train.steps_per_execution, int) else 4
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg.model, size, manifest["num_classes"]), cfg.train, spe)
    per_replica = batch // resolved.replicas

    def synthetic(context):
        images = tf.random.uniform([per_replica, size, size, 3], maxval=256, dtype=tf.int32)
        labels = tf.random.uniform([per_replica], maxval=manifest["num_classes"], dtype=tf.int32)
        return tf.data.Dataset.from_tensors((tf.cast(images, tf.uint8), labels)).repeat()

    synthetic_rate = training_steps_per_second(
        model, resolved.strategy.distribute_datasets_from_function(synthetic), spe, args.seconds)
    print(f"training, synthetic data: {synthetic_rate:8.2f} steps/s (spe {spe})", flush=True)
    real_dataset, _ = input_pipeline.distributed_dataset(
        resolved.strategy, cfg.data.dir, manifest, "train", batch, training=True, shuffle_buffer=cfg.data.shuffle_buffer)
    real_rate = training_steps_per_second(model, real_dataset, spe, args.seconds)
    input_bound = real_rate < INPUT_BOUND_MARGIN * synthetic_rate
    print(f"training, real data     : {real_rate:8.2f} steps/s -> "
          f"{'INPUT-BOUND: speed up the input (more shards, larger interleave, cache)' if input_bound else 'not input-bound'}",
          flush=True)
    print(json.dumps({"optimized_examples_per_s": round(optimized, 1), "naive_examples_per_s": round(naive, 1),
                      "speedup": round(optimized / naive, 2), "train_steps_per_s_synthetic": round(synthetic_rate, 2),
                      "train_steps_per_s_real": round(real_rate, 2), "input_bound": input_bound}))
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
