"""steps_per_execution: steps/s of each candidate on the real model, strategy and input, and the
value `train.steps_per_execution: auto` picks (the largest within 5% of the fastest), measured afresh.

    make bench-spe        # python -m {{ cookiecutter.package }}.bench_spe --config configs/local.yaml

The last line is JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Sequence

from . import tasks
from .core import config as config_lib
from .core import steps_per_execution as spe_lib
from .core import distribute, input_pipeline, levers, precision
from .core.errors import run_cli


def main(argv: Sequence[str] | None = None) -> int:
    cfg, _ = config_lib.command_line(__doc__.split("\n\n")[0], argv, registry=tasks)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps_per_execution="auto"))
    resolved = distribute.resolve(cfg.runtime)
    task = tasks.load(cfg.task)
    manifest = input_pipeline.read_manifest(cfg.data.dir, task, cfg.data)
    resolved.per_replica_batch_size(cfg.train.global_batch_size)
    applied = precision.apply(cfg.runtime.mixed_precision, resolved.kind)
    print(f"precision {applied.describe()}", flush=True)
    # Out of device memory measuring a candidate: training's one line, with the precision that runs.
    ran = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, mixed_precision=applied.precision))
    with levers.out_of_memory_reported(ran, task, manifest, resolved):
        chosen, measurements = spe_lib.choose_for(cfg, task, resolved, manifest)
    rate = {m.steps_per_execution: m.steps_per_second for m in measurements}
    best = max(rate.values())
    print(
        f"chosen {chosen}: {rate[chosen] / best:.2f}x the fastest, {rate[chosen] / rate[1]:.2f}x steps_per_execution=1"
    )
    print(
        json.dumps(
            {
                "chosen": chosen,
                "chosen_steps_per_s": round(rate[chosen], 2),
                "best_steps_per_s": round(best, 2),
                "spe1_steps_per_s": round(rate[1], 2),
                "candidates": {str(k): round(v, 2) for k, v in rate.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
