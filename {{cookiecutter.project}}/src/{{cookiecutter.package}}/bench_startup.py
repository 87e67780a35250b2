"""Time to first step of a fresh run, a resume and a rerun with the same settings, and the ratios.

    make bench-startup    # python -m {{ cookiecutter.package }}.bench_startup --config configs/local.yaml

Three real `train` processes with CONFIG and ARGS, in a scratch folder with an empty cache:
- fresh:  a new run directory, `train.total_steps` = one calibration limit (log/checkpoint interval);
          it measures steps_per_execution (when `auto`) and stores the choice
- resume: the same run directory trained one interval further: restores the checkpoint and reuses
          the run's own calibration
- rerun:  a new run directory with the same settings: reuses the cached calibration
Each process pays its own start-up (strategy, model, compilation), as every start of a real run
does. The figures are each start's `time to first step`, from its metrics.json. The last line is JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Sequence

from . import tasks
from .core import config as config_lib
from .core import input_pipeline
from .core import steps_per_execution as spe_lib
from .core.goodput import BEFORE_FIRST_STEP, time_to_first_step
from .core.errors import UserError, run_cli
from .core.run_dir import RunRecord


def start(config_file: str, overrides: list[str], output_dir: str, total_steps: int, cache: str) -> dict:
    """One `train` process; returns its start's entry of the goodput record."""
    command = [
        sys.executable,
        "-m",
        f"{__package__}.train",
        "--config",
        config_file,
        *overrides,
        f"runtime.output_dir={output_dir}",
        f"runtime.cache_dir={cache}",
        f"train.total_steps={total_steps}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if result.returncode != 0:
        last = ((result.stderr.strip() or result.stdout.strip()).splitlines() or ["no output"])[-1]
        raise UserError(last.removeprefix("error: ") if last.startswith("error: ") else f"training failed: {last}")
    for line in result.stdout.splitlines():
        if line.startswith(("time to first step", "steps_per_execution", "calibrating", "  chose")):
            print(f"    {line.strip()}", flush=True)
    return RunRecord(output_dir).last_start


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = config_lib.command_line(__doc__.split("\n\n")[0], argv, registry=tasks)
    overrides = [item for item in args.overrides if not item.startswith(("runtime.output_dir=", "train.total_steps="))]
    input_pipeline.read_manifest(
        cfg.data.dir, tasks.load(cfg.task), cfg.data
    )  # no data: the one-line error, before any run
    interval = spe_lib.limit(cfg.train)

    seconds = {}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        cache, run, other = (os.path.join(scratch, name) for name in ("cache", "run", "rerun"))
        for name, output_dir, steps in (
            ("fresh", run, interval),
            ("resume", run, 2 * interval),
            ("rerun", other, interval),
        ):
            print(f"{name}:", flush=True)
            phases = start(args.config, overrides, output_dir, steps, cache)["phase_seconds"]
            seconds[name] = time_to_first_step(phases)
            parts = ", ".join(f"{phase} {phases[phase]:.1f} s" for phase in BEFORE_FIRST_STEP if phase in phases)
            print(f"  time to first step {seconds[name]:.1f} s ({parts})", flush=True)
    resume, rerun = seconds["resume"] / seconds["fresh"], seconds["rerun"] / seconds["fresh"]
    print(f"resume/fresh {resume:.2f}x, rerun/fresh {rerun:.2f}x")
    figures = {f"{name}_seconds": round(value, 2) for name, value in seconds.items()}
    print(json.dumps({**figures, "resume_over_fresh": round(resume, 3), "rerun_over_fresh": round(rerun, 3)}))
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
