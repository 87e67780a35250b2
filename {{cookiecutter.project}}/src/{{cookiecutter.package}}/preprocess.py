"""`make preprocess`: raw data -> sharded TFRecords + manifest.json, in Apache Beam (core/preprocessing.py).

    python -m {{ cookiecutter.package }}.preprocess --input data/raw --output data/tfrecords [--config FILE] [key=value ...]
    python -m {{ cookiecutter.package }}.preprocess --input gs://BUCKET/raw --output gs://BUCKET/tfrecords \\
        --runner DataflowRunner --project P --region R --temp_location gs://BUCKET/tmp ...

Without --runner the job runs on the FnApiRunner, in this process or in worker processes as the
input's size decides (`preprocessing.choose_local_runner`). `--dry_run=True` with the
DataflowRunner builds the Dataflow job (and stages nothing), prints its options and steps, and
submits nothing: `make preprocess RUNNER=dataflow DRY_RUN=1`.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Sequence

from . import tasks
from .core import config as config_lib
from .core import preprocessing, topology
from .core.errors import UserError, run_cli


def parse_args(argv: Sequence[str] | None):
    """(our arguments, `dotted.key=value` config overrides, Beam's pipeline options)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="key=value arguments override the config (e.g. data.eval_fraction=0.2); "
        "other arguments are passed to Beam as pipeline options.",
    )
    parser.add_argument(
        "--input", required=True, help=f"raw data: {tasks.load(tasks.DEFAULT).raw_format} (local or gs://)"
    )
    parser.add_argument("--output", required=True, help="folder for shards and manifest.json (local or gs://)")
    parser.add_argument("--config", help="config file whose data.* keys to use (default: the built-in defaults)")
    parser.add_argument("--num_shards", type=int, help="shards per split (default: from the data size)")
    parser.add_argument(
        "--reading_hosts",
        type=int,
        default=topology.topology().hosts,
        help="hosts that will read the data in parallel (default: from the TPU type)",
    )
    parser.add_argument("--compression", choices=("none", "gzip"), default="none")
    overrides = [arg for arg in (argv or []) if re.fullmatch(r"[A-Za-z_]+\.[A-Za-z_.]+=.*", arg)]
    args, beam_args = parser.parse_known_args([arg for arg in (argv or []) if arg not in overrides])
    return args, overrides, beam_args


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides, beam_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    cfg = config_lib.load(args.config, overrides, registry=tasks)
    if args.num_shards is not None and args.num_shards < 1:
        raise UserError(f"--num_shards must be at least 1, got {args.num_shards}")
    return preprocessing.run(
        args.input,
        args.output,
        tasks.load(cfg.task),
        cfg.data,
        beam_args,
        args.reading_hosts,
        args.num_shards,
        args.compression,
    )


if __name__ == "__main__":
    preprocessing.quiet_beam_logging()
    run_cli(main, sys.argv[1:])
