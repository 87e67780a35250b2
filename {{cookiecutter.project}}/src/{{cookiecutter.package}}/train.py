"""`make train`: runs or resumes training, then evaluates and exports (trainer.py does the work).

    python -m {{ cookiecutter.package }}.train --config configs/local.yaml [dotted.key=value ...]

A run lives in `runtime.output_dir`: config.yaml (the resolved config), checkpoints/, logs/
(TensorBoard: train, eval, profiles), metrics.json, and export/ (a SavedModel for serving).
Running the same command again resumes from the latest checkpoint. SIGTERM (a spot or
preemptible TPU VM being reclaimed, maintenance) saves a checkpoint and exits with status 143
within one execution of `steps_per_execution` steps; a NaN loss stops the run without saving.
A run that finished, or stopped early (`train.early_stop_patience`), is evaluated again, not
trained further; a larger `train.total_steps` trains a finished one on.
"""

from __future__ import annotations

import signal
import sys
from typing import Sequence

from . import STARTED, tasks
from .core import config as config_lib
from .core.errors import run_cli
from .core.trainer import Preempted, train

# What a process killed by SIGTERM reports: a scheduler that sends SIGTERM (a TPU VM's shutdown,
# Kubernetes, Slurm) reads this exit status as "stopped as asked", not as a failure.
PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM


def main(argv: Sequence[str] | None = None) -> int:
    cfg, _ = config_lib.command_line(__doc__.split("\n\n")[0], argv, registry=tasks)
    try:
        train(cfg, tasks.load(cfg.task), started=STARTED)
    except Preempted:
        return PREEMPTED_EXIT_STATUS
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
