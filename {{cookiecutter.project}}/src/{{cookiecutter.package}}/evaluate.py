"""Evaluation: every eval example exactly once, on any number of replicas and hosts.

    python -m {{ cookiecutter.package }}.evaluate --config configs/local.yaml [dotted.key=value ...]

Restores the latest checkpoint of `runtime.output_dir`, evaluates the eval split and writes
metrics.json (the task's metrics, loss, global_step, examples_per_second) next to it. `make train` runs the
same evaluation at the end of training.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Sequence

import tensorflow as tf

from . import config as config_lib
from . import distribute, input_pipeline, precision
from .errors import UserError, run_cli
from . import tasks
from .model import LOSS_METRIC, build_model, compile_model, metric_names


def run_path(output_dir: str, *parts: str) -> str:
    return "/".join([output_dir.rstrip("/"), *parts])


def sync_replica_statistics(model, strategy: tf.distribute.Strategy) -> None:
    """Gives every replica the mean of the per-replica statistics (batch norm's moving mean and
    variance): the values a checkpoint stores and the export serves.

    Such variables are synchronised on read: during training each replica updates its own copy from
    its own batches. Left alone, an evaluation in the training process would judge each replica's
    share of the eval set with that replica's statistics, and so disagree with the same evaluation
    after a restore (or with the exported model), most of all early in training and with small
    per-replica batches.
    """
    with strategy.scope():
        for variable in model.non_trainable_variables:
            if getattr(variable, "synchronization", None) == tf.VariableSynchronization.ON_READ:
                variable.assign(variable.read_value())


def evaluate_model(model, strategy, cfg: config_lib.Config, manifest: dict) -> dict:
    """The task's weighted metrics and loss over the whole eval split, and its throughput."""
    sync_replica_statistics(model, strategy)
    dataset, steps = input_pipeline.distributed_dataset(
        strategy, cfg.data.dir, manifest, "eval", cfg.train.global_batch_size, training=False
    )
    started = time.perf_counter()
    results = model.evaluate(dataset, steps=steps, verbose=0, return_dict=True)
    elapsed = time.perf_counter() - started
    examples = manifest["splits"]["eval"]["num_examples"]
    return {
        **{name: float(results[LOSS_METRIC if name == "loss" else name]) for name in metric_names()},
        "eval_examples": examples,
        "eval_examples_per_second": examples / elapsed,
    }


def describe(metrics: dict) -> str:
    """The metrics in words, the task's headline first: e.g. 'accuracy 0.9313, loss 0.2208'."""
    headline = tasks.current().headline_metric
    names = [headline, *(name for name in metric_names() if name != headline)]
    return ", ".join(f"{name} {metrics[name]:.4f}" for name in names)


def write_metrics(output_dir: str, metrics: dict) -> str:
    path = run_path(output_dir, "metrics.json")
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(json.dumps(metrics, indent=2) + "\n")
    return path


def write_eval_summaries(output_dir: str, metrics: dict, step: int) -> None:
    writer = tf.summary.create_file_writer(run_path(output_dir, "logs", "eval"))
    with writer.as_default(step=step):
        for name in metric_names():
            tf.summary.scalar(name, metrics[name])
    writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    cfg, _ = config_lib.command_line(__doc__.split("\n\n")[0], argv)

    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(cfg.data.dir, cfg.data)
    latest = tf.train.latest_checkpoint(run_path(cfg.runtime.output_dir, "checkpoints"))
    if latest is None:
        raise UserError(
            f"no checkpoint in {run_path(cfg.runtime.output_dir, 'checkpoints')}; "
            "run `make train` first or set runtime.output_dir to a run directory"
        )
    resolved.per_replica_batch_size(cfg.train.global_batch_size)
    print(f"precision {precision.apply(cfg.runtime.mixed_precision, resolved.kind).describe()}", flush=True)
    with resolved.strategy.scope():
        model = build_model(cfg, manifest)
        compile_model(model, cfg.train, 1)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        checkpoint.restore(latest).expect_partial()
    step = int(model.optimizer.iterations.numpy())
    print(f"evaluating {latest} (step {step})", flush=True)
    metrics = evaluate_model(model, resolved.strategy, cfg, manifest)
    previous = {}
    path = run_path(cfg.runtime.output_dir, "metrics.json")
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as handle:
            previous = json.load(handle)
    metrics = {
        **previous,
        **metrics,
        "global_step": step,
        "examples_per_second": previous.get("examples_per_second", metrics["eval_examples_per_second"]),
    }
    write_metrics(cfg.runtime.output_dir, metrics)
    print(f"eval {describe(metrics)} on {metrics['eval_examples']} examples at step {step} -> {path}")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
