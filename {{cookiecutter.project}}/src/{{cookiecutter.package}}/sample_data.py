"""Writes the task's generated sample raw data to RAW (`make data`); nothing is downloaded.

python -m {{ cookiecutter.package }}.sample_data [--config FILE] [--output RAW] [--small]

The task is the one the config names; the folder defaults to the config's `data.raw`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .core import config as config_lib
from . import tasks
from .core.errors import run_cli


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="config file naming the task (default: this project's task)")
    parser.add_argument("--output", help="folder to write (created); default: the config's data.raw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true", help="a few hundred examples, for quick tries and tests")
    args = parser.parse_args(argv)
    cfg = config_lib.load(args.config, registry=tasks)
    output = Path(args.output or cfg.data.raw)
    print(f"writing sample data to {output}/", flush=True)
    print(tasks.load(cfg.task).write_sample_data(output, seed=args.seed, small=args.small))
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
