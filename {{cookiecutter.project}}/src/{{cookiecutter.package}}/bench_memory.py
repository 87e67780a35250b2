"""Does the memory estimate hold? The activations `make doctor` plans (core/memory.py) against the
memory this host's process actually grows by, between two batch sizes of the config's model.

    make bench-memory     # python -m {{ cookiecutter.package }}.bench_memory --config configs/local.yaml

Each batch size trains a few steps in a fresh process, on one CPU device, in the run's precision,
on synthetic data shaped like the task's batches; its peak resident memory is read after the
steps. The difference between two batch sizes is what the larger batch's activations took (the
weights, the optimizer and TensorFlow itself are the same in both), and is set against the
difference of the estimate's activation terms. TensorFlow on a CPU keeps what the backward pass
reads, unfused; XLA on a TPU fuses elementwise work, so a TPU keeps less: read the factor as an
upper bound's margin. The last line is JSON.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Sequence

import tensorflow as tf

from .core import config as config_lib
from .core import input_pipeline, memory, precision
from . import tasks
from .core.errors import run_cli
from .core.model import build_model, compile_model

MIB = 2**20


def child(cfg, task, batch: int, steps: int) -> dict:
    """Trains `steps` steps of `batch` examples; the estimate and the peak resident memory."""
    chosen = precision.apply(cfg.runtime.mixed_precision, "cpu").precision
    try:
        manifest = input_pipeline.read_manifest(cfg.data.dir, task, cfg.data)
    except Exception:  # noqa: BLE001 - no data yet: the model's nominal shapes do
        manifest = task.nominal_manifest(cfg.data)
    model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, 1)
    plan = memory.Planner(cfg, task, manifest).plan(batch, 0, precision_name=chosen)
    data = tf.data.Dataset.from_tensors(task.synthetic_batch(batch, manifest)).repeat()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"batch": batch, "precision": chosen, "peak_mib": peak_kib / 1024, "activations_mib": plan.activations / MIB}


def main(argv: Sequence[str] | None = None) -> int:
    def arguments(parser):
        parser.add_argument(
            "--batches", default="", help="two batch sizes, e.g. 16,128 (default: the per-replica batch and 8x it)"
        )
        parser.add_argument("--steps", type=int, default=3, help="training steps per batch size")
        parser.add_argument("--child", type=int, default=0, help="(internal) measure one batch size in this process")

    cfg, args = config_lib.command_line(__doc__.split("\n\n")[0], argv, arguments, registry=tasks)
    if args.child:
        print(json.dumps(child(cfg, tasks.load(cfg.task), args.child, args.steps)))
        return 0
    per_replica = max(1, cfg.train.global_batch_size // max(1, cfg.runtime.cpu_devices))
    small, large = [int(value) for value in args.batches.split(",")] if args.batches else (per_replica, 8 * per_replica)
    measured = []
    for batch in (small, large):
        command = [sys.executable, "-m", f"{__package__}.bench_memory", *(argv if argv is not None else sys.argv[1:])]
        command += ["--child", str(batch)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "-1"}
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if result.returncode:
            print(result.stdout + result.stderr, file=sys.stderr)
            return result.returncode
        measured.append(json.loads(result.stdout.strip().splitlines()[-1]))
        print(
            f"batch {batch:5d}: peak resident {measured[-1]['peak_mib']:8.1f} MiB, estimated activations "
            f"{measured[-1]['activations_mib']:8.1f} MiB ({measured[-1]['precision']})",
            flush=True,
        )
    grown = measured[1]["peak_mib"] - measured[0]["peak_mib"]
    estimated = measured[1]["activations_mib"] - measured[0]["activations_mib"]
    ratio = grown / estimated if estimated > 0 else float("nan")
    print(
        f"from batch {small} to {large}: the process grew {grown:.1f} MiB, the estimate's activations "
        f"{estimated:.1f} MiB: measured/estimated {ratio:.2f}",
        flush=True,
    )
    print(
        json.dumps(
            {
                "task": cfg.task,
                "batches": [small, large],
                "precision": measured[0]["precision"],
                "measured_growth_mib": round(grown, 1),
                "estimated_growth_mib": round(estimated, 1),
                "measured_over_estimated": round(ratio, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
