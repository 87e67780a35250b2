"""Evaluation: every eval example exactly once, on any number of replicas and hosts.

The padded last batches carry weight-0 examples (input_pipeline.py), and every metric is weighted,
so the metrics count each real example once. `make train` evaluates with this at its eval
boundaries and at the end; `make eval` (evaluate.py) on the latest checkpoint.
"""

from __future__ import annotations

import time
import weakref

import numpy as np
import tensorflow as tf

from . import config as config_lib
from . import baselines, input_pipeline
from .errors import UserError
from .model import LOSS_METRIC, metric_names
from .run_dir import run_path


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


def evaluate_model(model, strategy, cfg: config_lib.Config, task, manifest: dict) -> dict:
    """`task`'s weighted metrics and loss over the whole eval split, and its throughput."""
    sync_replica_statistics(model, strategy)
    dataset, steps = input_pipeline.distributed_dataset(
        strategy,
        cfg.data.dir,
        task,
        manifest,
        "eval",
        cfg.train.global_batch_size,
        training=False,
        cache=cfg.data.cache,
        data_config=cfg.data,
    )
    started = time.perf_counter()
    results = model.evaluate(dataset, steps=steps, verbose=0, return_dict=True)
    if task.split_metric_names:
        dataset, steps = input_pipeline.distributed_dataset(
            strategy,
            cfg.data.dir,
            task,
            manifest,
            "eval",
            cfg.train.global_batch_size,
            training=False,
            cache=cfg.data.cache,
            data_config=cfg.data,
        )
        outputs, targets = split_outputs(model, strategy, dataset, steps)
        results.update(split_metrics(model, outputs, targets, cfg, task, manifest))
    elapsed = time.perf_counter() - started
    examples = manifest["splits"]["eval"]["num_examples"]
    return {
        **{
            name: float(results[LOSS_METRIC if name == "loss" and LOSS_METRIC in results else name])
            for name in metric_names(cfg, task, manifest)
        },
        "eval_examples": examples,
        "eval_examples_per_second": examples / elapsed,
    }


def split_metrics(model, outputs, targets, cfg: config_lib.Config, task, manifest: dict) -> dict:
    """The task's whole-split metrics from one call, checked to be the names it declares."""
    found = task.split_metrics(model, outputs, targets, cfg.objective, manifest)
    names = task.split_metric_names
    if not isinstance(found, dict):
        raise UserError(
            f"the task's split_metrics returned a {type(found).__name__}: return a dict of a value for every name in "
            f"its split_metric_names ({list(names)})"
        )
    missing, unexpected = [name for name in names if name not in found], [name for name in found if name not in names]
    if missing or unexpected:
        advice = [
            *([f"return {missing} too, or drop them from split_metric_names"] if missing else []),
            *([f"declare {unexpected} in split_metric_names"] if unexpected else []),
        ]
        raise UserError(
            f"the task's split_metrics returned {list(found)}, its split_metric_names are {list(names)}: "
            f"{'; '.join(advice)}"
        )
    return {name: found[name] for name in names}


# The traced whole-split step of each model, by strategy: a run evaluates the same model every
# train.eval_every steps, and a new trace at each would repeat the first one's tracing and compiling.
# Weak keys, and a weak reference in the step, so that the cache keeps no model alive.
_output_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def output_step(model, strategy: tf.distribute.Strategy):
    """The step of `split_outputs`: one batch per replica through `model` in inference mode, its
    outputs, targets and weights gathered from every replica. Traced once per model and strategy."""
    steps = _output_steps.setdefault(model, {})
    if strategy not in steps:
        reference = weakref.ref(model)

        def replica_step(features, targets, weights):
            return reference()(features, training=False), targets, weights

        @tf.function
        def step(iterator):
            per_replica = strategy.run(replica_step, args=next(iterator))
            return tf.nest.map_structure(lambda value: strategy.gather(value, axis=0), per_replica)

        steps[strategy] = step
    return steps[strategy]


def split_outputs(model, strategy: tf.distribute.Strategy, dataset, steps: int):
    """(the model's outputs, the targets) of every eval example exactly once, as numpy arrays (or dicts
    of them), for the task's whole-split metrics: each step's per-replica results are gathered to the
    host and the padding (weight 0) is dropped. The order of examples is the input's, interleaved by
    replica; a whole-split metric does not depend on it."""
    step = output_step(model, strategy)
    iterator, parts = iter(dataset), []
    for _ in range(steps):
        parts.append(tf.nest.map_structure(lambda tensor: tensor.numpy(), step(iterator)))
    outputs, targets, weights = tf.nest.map_structure(lambda *arrays: np.concatenate(arrays), *parts)
    real = weights > 0
    return tuple(tf.nest.map_structure(lambda array: array[real], (outputs, targets)))


def describe(metrics: dict, names: list[str], task, found_baselines: dict | None = None) -> str:
    """The metrics `names` in words, `task`'s headline first, then the data's baselines (the
    manifest's) and whether the headline beats the best: e.g. 'accuracy 0.9313, loss 0.2208;
    baselines: majority 0.2500, bag-of-words 0.9100 (beaten)'."""
    headline = task.headline_metric
    names = [headline, *(name for name in names if name != headline)]
    described = ", ".join(f"{name} {metrics[name]:.4f}" for name in names)
    beaten = baselines.beats(metrics[headline], found_baselines)
    if beaten is None:
        return described
    verdict = "beaten" if beaten else "NOT beaten: see make doctor"
    return f"{described}; {baselines.describe(found_baselines)} ({verdict})"


def write_eval_summaries(output_dir: str, metrics: dict, step: int, names: list[str]) -> None:
    writer = tf.summary.create_file_writer(run_path(output_dir, "logs", "eval"))
    with writer.as_default(step=step):
        for name in names:
            tf.summary.scalar(name, metrics[name])
    writer.close()


def judged(metrics: dict, step: int, task, manifest: dict) -> dict:
    """An evaluation as the run record keeps it, for `make train` and `make eval` alike: the metrics,
    the step they were measured at, and the data's baselines with whether the headline beats them."""
    found = manifest.get("baselines")
    return {**metrics, "global_step": step, **baselines.summary(metrics[task.headline_metric], found)}
