"""Time to first step of the configured run, fresh and resumed after a preemption, against its wall time.

    make bench-startup    # python -m {{ cookiecutter.package }}.bench_startup --config configs/local.yaml

Three real `train` processes with CONFIG and ARGS (the run as configured: its train.total_steps), in
a scratch folder with an empty cache:
- fresh:  a new run directory, trained to its end; it measures steps_per_execution (when `auto`)
          and stores the choice in the cache
- rerun:  a new run directory with the same settings: reuses the cached calibration; sent SIGTERM
          once it prints its time to first step, as a preemption would, so it saves a checkpoint at
          the end of that execution and exits
- resume: the rerun's directory again: restores that checkpoint, reuses the run's own calibration,
          and trains to the end
Each process pays its whole start-up (importing TensorFlow, the strategy, the model, tracing and
compiling), as every start of a real run does. The figures are each start's from its metrics.json:
its time to first step (from the process's start to the end of its first execution), and its wall
time (the sum of its phases: start-up to export). Shares are time to first step over that start's
wall time; the resume's start trains all but the rerun's first execution, about the whole run.
The last line is JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Sequence

from . import tasks
from .core import config as config_lib
from .core import input_pipeline
from .core.goodput import BEFORE_FIRST_STEP, PREEMPTED, time_to_first_step
from .core.errors import UserError, run_cli
from .core.run_dir import RunRecord

SHOWN = ("time to first step", "steps_per_execution", "calibrating", "  chose", "  stopped", "preempted", "resumed")


def start(config_file: str, overrides: list[str], output_dir: str, cache: str, preempt: bool = False) -> dict:
    """One `train` process (sent SIGTERM after its first step when `preempt`); returns its start's
    entry of the goodput record."""
    command = [
        sys.executable,
        "-m",
        f"{__package__}.train",
        "--config",
        config_file,
        *overrides,
        f"runtime.output_dir={output_dir}",
        f"runtime.cache_dir={cache}",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one pipe, read to its end: a full stderr pipe cannot stall the run
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(SHOWN):
            print(f"    {line.strip()}", flush=True)
        if preempt and line.startswith("time to first step"):
            process.send_signal(signal.SIGTERM)
    status = process.wait()
    if status not in ((0, 128 + signal.SIGTERM) if preempt else (0,)):
        last = ("".join(lines).strip().splitlines() or ["no output"])[-1]
        raise UserError(last.removeprefix("error: ") if last.startswith("error: ") else f"training failed: {last}")
    record = RunRecord(output_dir).last_start
    if preempt and record["end"] != PREEMPTED:
        raise UserError(
            f"the run ended {record['end']!r} before the SIGTERM after its first step stopped it: "
            "raise train.total_steps so that there is a resume to time"
        )
    return record


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = config_lib.command_line(__doc__.split("\n\n")[0], argv, registry=tasks)
    overrides = [item for item in args.overrides if not item.startswith(("runtime.output_dir=", "runtime.cache_dir="))]
    input_pipeline.read_manifest(
        cfg.data.dir, tasks.load(cfg.task), cfg.data
    )  # no data: the one-line error, before any run

    first, wall = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        cache, run, other = (os.path.join(scratch, name) for name in ("cache", "run", "rerun"))
        for name, output_dir, preempt in (("fresh", run, False), ("rerun", other, True), ("resume", other, False)):
            print(f"{name}:", flush=True)
            phases = start(args.config, overrides, output_dir, cache, preempt)["phase_seconds"]
            first[name], wall[name] = time_to_first_step(phases), sum(phases.values())
            parts = ", ".join(f"{phase} {phases[phase]:.1f} s" for phase in BEFORE_FIRST_STEP if phases.get(phase))
            print(
                f"  time to first step {first[name]:.1f} s of {wall[name]:.1f} s wall: "
                f"{first[name] / wall[name]:.2f} ({parts})",
                flush=True,
            )
    shares = {name: first[name] / wall[name] for name in ("fresh", "resume")}
    resume, rerun = first["resume"] / first["fresh"], first["rerun"] / first["fresh"]
    print(
        f"time to first step / wall: fresh {shares['fresh']:.2f}, resume {shares['resume']:.2f}; "
        f"resume/fresh {resume:.2f}x, rerun/fresh {rerun:.2f}x"
    )
    figures = {f"{name}_seconds": round(value, 2) for name, value in first.items()}
    walls = {f"{name}_wall_seconds": round(wall[name], 2) for name in ("fresh", "resume")}
    print(
        json.dumps(
            {
                **figures,
                **walls,
                "fresh_share": round(shares["fresh"], 3),
                "resume_share": round(shares["resume"], 3),
                "resume_over_fresh": round(resume, 3),
                "rerun_over_fresh": round(rerun, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
