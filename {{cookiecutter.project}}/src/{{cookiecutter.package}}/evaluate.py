"""Evaluation: every eval example exactly once, on any number of replicas and hosts.

    python -m {{ cookiecutter.package }}.evaluate --config configs/local.yaml [dotted.key=value ...]

Restores the newest readable checkpoint of `runtime.output_dir` (a save cut short falls back to the
one before, as `make train` does), evaluates the eval split and writes
metrics.json (the task's metrics, loss, global_step, examples_per_second) next to it. `make train` runs the
same evaluation at the end of training.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Sequence

import tensorflow as tf

from .core import config as config_lib
from . import tasks
from .core import distribute, input_pipeline, precision
from .core.errors import UserError, run_cli
from .core.evaluation import describe, evaluate_model, judged
from .core.model import build_model, compile_model, metric_names
from .core.levers import out_of_memory_reported
from .core.run_dir import RunRecord, latest_checkpoint, restore_newest_readable, run_path


def main(argv: Sequence[str] | None = None) -> int:
    cfg, _ = config_lib.command_line(__doc__.split("\n\n")[0], argv, registry=tasks)
    task = tasks.load(cfg.task)

    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(cfg.data.dir, task, cfg.data)
    latest = latest_checkpoint(cfg.runtime.output_dir)
    if latest is None:
        raise UserError(
            f"no checkpoint in {run_path(cfg.runtime.output_dir, 'checkpoints')}; "
            "run `make train` first or set runtime.output_dir to a run directory"
        )
    resolved.per_replica_batch_size(cfg.train.global_batch_size)
    chosen = precision.apply(cfg.runtime.mixed_precision, resolved.kind)
    # The precision that runs, in a new config (the levers of an out-of-memory line depend on it).
    cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, mixed_precision=chosen.precision))
    print(f"precision {chosen.describe()}", flush=True)
    with out_of_memory_reported(cfg, task, manifest, resolved):
        with resolved.strategy.scope():
            model = build_model(cfg, task, manifest)
            compile_model(model, cfg, task, manifest, 1)
            checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        # The newest checkpoint that can be read, as `make train` restores: a save cut short falls
        # back to the one before, with a one-line note (the input's cursor is training's only).
        manager = tf.train.CheckpointManager(checkpoint, run_path(cfg.runtime.output_dir, "checkpoints"), None)
        latest = restore_newest_readable(checkpoint, manager)
        step = int(model.optimizer.iterations.numpy())
        print(f"evaluating {latest} (step {step})", flush=True)
        metrics = evaluate_model(model, resolved.strategy, cfg, task, manifest)
    record = RunRecord(cfg.runtime.output_dir)
    record.update(
        **judged(metrics, step, task, manifest),
        examples_per_second=(
            metrics["eval_examples_per_second"] if record.examples_per_second is None else record.examples_per_second
        ),
    )
    path = record.write()
    described = describe(metrics, metric_names(cfg, task, manifest), task, manifest.get("baselines"))
    print(f"eval {described} on {metrics['eval_examples']} examples at step {step} -> {path}")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
