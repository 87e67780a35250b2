"""Writes the task's generated sample raw data to RAW (`make data`); nothing is downloaded.

python -m {{ cookiecutter.package }}.sample_data --output data/raw [--small]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from . import tasks
from .errors import run_cli


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="data/raw", help="folder to write (created)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true", help="a few hundred examples, for quick tries and tests")
    args = parser.parse_args(argv)
    output = Path(args.output)
    print(f"writing sample data to {output}/", flush=True)
    print(tasks.current().write_sample_data(output, seed=args.seed, small=args.small))
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
