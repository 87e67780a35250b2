"""Prints the resolved config, or one key of it (the Makefile reads data.dir, runtime.output_dir, ...).

    python -m {{ cookiecutter.package }}.config --config configs/local.yaml [--get KEY] [dotted.key=value ...]

The typed config itself (every key, its meaning and its checks) is core/config.py.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import tasks
from .core.config import all_keys, dump, load, unknown_key
from .core.errors import run_cli


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the resolved config, or one key of it (used by the Makefile)."""
    parser = argparse.ArgumentParser(description="Print the resolved config or one of its keys.")
    parser.add_argument("--config", help="YAML file under configs/")
    parser.add_argument("--get", metavar="KEY", help="print only this dotted key, e.g. runtime.output_dir")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value")
    args = parser.parse_args(argv)
    config = load(args.config, args.overrides, registry=tasks)
    if args.get == "task":
        print(config.task)
    elif args.get:
        section, _, name = args.get.partition(".")
        if args.get not in all_keys(config):
            raise unknown_key(args.get, "in --get", config, tasks)
        print(getattr(getattr(config, section), name))
    else:
        print(dump(config), end="")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
