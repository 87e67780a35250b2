"""Times the Beam preprocessing pipeline against a plain single-process loop on the same data.

    python -m {{ cookiecutter.package }}.bench_preprocess --input data/raw --config configs/local.yaml [key=value ...]

Both do the same work with the same functions (the task's `read_raw`, `vocabularies`,
`fit_encoding` and `encode`, `preprocessing.write_tfrecords`) and write the same shards, each to its
own temporary folder; a raw input the task rejects is skipped by both, as preprocessing does:

- beam: `preprocessing.run` on the in-process FnApiRunner with one worker (what `make preprocess`
  runs locally), listing and the final rename and manifest included;
- plain: one Python loop that lists, reads, decodes, encodes, groups by shard and writes;
- beam_multi (unless --no_multi): the same pipeline with --direct_num_workers=N in
  multi_processing mode, whose worker processes each import TensorFlow first (counted).

The small sample folder is too quick to time reliably, so when it holds fewer than --min_files
files its files are copied, under new names, into a temporary folder until there are enough
(copies decode exactly like the originals; nothing is downloaded).

The last line printed is JSON: {"beam_records_per_s", "plain_records_per_s", "ratio", ...}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from . import tasks
from .core import config as config_lib
from .core import preprocessing, topology
from .core.errors import UserError, run_cli
from .core.task import RawRejection, Rejected


def replicate(input_root: str, task, min_files: int, destination: Path) -> tuple[str, int]:
    """(folder with at least `min_files` raw files of `task`, how many): `input_root` itself when it
    has enough, else copies of its files (renamed `<stem>_copyN<ext>`) under `destination`."""
    paths = task.list_raw(input_root).units
    if len(paths) >= min_files:
        return input_root, len(paths)
    copies = math.ceil(min_files / len(paths))
    print(
        f"{len(paths)} files in {input_root}: copying them {copies}x into {destination} (--min_files {min_files})",
        flush=True,
    )
    for relative in paths:
        data = preprocessing.read_file(preprocessing.join(input_root, relative))
        folder, _, name = relative.rpartition("/")
        stem, dot, extension = name.rpartition(".")
        (destination / folder).mkdir(parents=True, exist_ok=True)
        for copy in range(copies):
            (destination / folder / f"{stem}_copy{copy}{dot}{extension}").write_bytes(data)
    return str(destination), len(paths) * copies


def read_all(input_root: str, task, eval_fraction: float) -> list:
    """(split, RawExample) of every raw example `task` reads, in listing order."""
    examples = []
    listing = task.list_raw(input_root)
    for relative in listing.units:
        data = preprocessing.read_file(preprocessing.locate(listing.root or input_root, relative))
        for item in task.read_raw(relative, data):
            if not isinstance(item, RawRejection):
                examples.append((item.split or preprocessing.split_of(item.source, eval_fraction), item))
    return examples


def plain_loop(input_root: str, output: str, task, data, num_shards: int, compression: str) -> int:
    """The same work as the pipeline (the task's `pack` included), in one process; returns the number
    of records written."""
    examples = read_all(input_root, task, data.eval_fraction)
    vocabularies = preprocessing.vocabulary_names(
        preprocessing.count_vocabularies(task, (example for _, example in examples))
    )
    artifacts = {}
    if task.needs_encoding_fit:
        keyed = sorted(
            (preprocessing._hash_unit(example.source, b"fit:"), example.payload)
            for split, example in examples
            if split == "train"
        )
        artifacts = preprocessing.fit_artifacts(keyed[: task.encoding_sample_size(data)], task, data, output)
    by_shard = defaultdict(list)
    for split, example in examples:
        try:
            record, _ = task.encode(example, data, vocabularies, artifacts)
        except Rejected:  # rejected, as in the pipeline
            continue
        by_shard[(split, preprocessing.shard_of(example.source, num_shards))].append(
            (preprocessing.order_key(example.source), record)
        )
    os.makedirs(output, exist_ok=True)
    written = 0
    for (split, shard), records in sorted(by_shard.items()):
        name = f"{split}-{shard:05d}-of-{num_shards:05d}{preprocessing.shard_suffix(compression)}"
        packed, _ = task.pack(split, [record for _, record in sorted(records)], data)
        written += preprocessing.write_tfrecords(preprocessing.join(output, name), packed, compression)[0]
    return written


def warm_up(input_root: str, task, data) -> None:
    """Imports and first-use costs (TensorFlow's protos, decoders) paid before timing, on the
    first example the task accepts: a rejected one is skipped, as preprocessing does."""
    examples = [example for _, example in read_all(input_root, task, data.eval_fraction)[:50]]
    vocabularies = preprocessing.vocabulary_names(preprocessing.count_vocabularies(task, examples))
    for example in examples:
        try:
            task.encode(example, data, vocabularies, {})
            return
        except Rejected:
            continue
        except Exception:  # needs the fitted artifacts (a tokenizer): the timed runs pay alike
            return


def timed(label: str, function, *args) -> tuple[float, object]:
    print(f"-- {label} ...", flush=True)
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def run_beam(input_root: str, output: str, task, data, num_shards: int, compression: str, *beam_args: str) -> int:
    status = preprocessing.run(
        input_root,
        output,
        task,
        data,
        ["--runner=FnApiRunner", *beam_args],
        topology.topology().hosts,
        num_shards,
        compression,
    )
    if status:
        raise RuntimeError(f"the pipeline exited with status {status}")
    with open(os.path.join(output, preprocessing.MANIFEST)) as handle:
        manifest = json.load(handle)
    return sum(split["num_examples"] for split in manifest["splits"].values())


def same_shards(first: str, second: str) -> bool:
    """Whether two output folders hold byte-identical shard files."""

    def shards(folder):
        return {p.name: p.read_bytes() for p in sorted(Path(folder).glob("*.tfrecord*"))}

    return shards(first) == shards(second)


def compare_one_worker(input_root: str, scratch: Path, common: tuple, repeats: int) -> tuple[dict, float]:
    """Beam on one worker against the plain loop, alternated `repeats` times: (the figures, the plain
    loop's best seconds). Both must write byte-identical shards."""
    beam_times, plain_times = [], []
    for repeat in range(1, max(1, repeats) + 1):
        # Alternated, so that a burst of load on a shared machine does not favour one side.
        seconds, beam_records = timed(
            f"beam, FnApiRunner, 1 worker (run {repeat})",
            run_beam,
            input_root,
            str(scratch / "beam"),
            *common,
            "--direct_num_workers=1",
        )
        beam_times.append(seconds)
        seconds, plain_records = timed(
            f"plain loop, 1 process (run {repeat})", plain_loop, input_root, str(scratch / "plain"), *common
        )
        plain_times.append(seconds)
        print(f"   beam {beam_times[-1]:.2f}s, plain {plain_times[-1]:.2f}s", flush=True)
    beam_s, plain_s = min(beam_times), min(plain_times)
    if beam_records != plain_records or not same_shards(scratch / "beam", scratch / "plain"):
        raise RuntimeError(
            f"beam and the plain loop wrote different shards ({beam_records} vs {plain_records} records)"
        )
    figures = {
        "beam_records_per_s": round(beam_records / beam_s, 1),
        "plain_records_per_s": round(plain_records / plain_s, 1),
        "ratio": round(plain_s / beam_s, 3),
        "records": beam_records,
        "beam_s": round(beam_s, 2),
        "plain_s": round(plain_s, 2),
    }
    print(
        f"best of {len(beam_times)}: beam {beam_s:.2f}s ({figures['beam_records_per_s']:.0f} records/s), "
        f"plain {plain_s:.2f}s ({figures['plain_records_per_s']:.0f} records/s): "
        f"beam runs at {figures['ratio']:.2f}x the plain loop, identical shards",
        flush=True,
    )
    return figures, plain_s


def compare_multi_worker(input_root: str, scratch: Path, common: tuple, workers: int, plain_s: float) -> dict:
    """Beam with `workers` processes, against the plain loop's best time."""
    multi_s, multi_records = timed(
        f"beam, FnApiRunner, {workers} worker processes",
        run_beam,
        input_root,
        str(scratch / "beam_multi"),
        *common,
        f"--direct_num_workers={workers}",
        "--direct_running_mode=multi_processing",
    )
    identical = same_shards(scratch / "beam_multi", scratch / "plain")
    if not identical:  # e.g. protobuf map fields serialized in a per-process order
        print(
            "WARNING: the worker processes wrote different bytes than this process: the "
            "encoding is not deterministic across processes",
            flush=True,
        )
    figures = {
        "multi_identical_shards": identical,
        "workers": workers,
        "beam_multi_records_per_s": round(multi_records / multi_s, 1),
        "beam_multi_s": round(multi_s, 2),
        "multi_ratio": round(plain_s / multi_s, 3),
    }
    print(
        f"beam with {workers} worker processes {multi_s:.2f}s "
        f"({figures['beam_multi_records_per_s']:.0f} records/s): {figures['multi_ratio']:.2f}x "
        f"the plain loop (on {os.cpu_count()} CPUs; each worker imports TensorFlow first)",
        flush=True,
    )
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help=f"raw data, {tasks.load(tasks.DEFAULT).raw_format} (local)")
    parser.add_argument("--config", help="config file whose data.* keys to use")
    parser.add_argument(
        "--min_files",
        type=int,
        default=6000,
        help="replicate the input's files into a temporary folder up to this many",
    )
    parser.add_argument("--num_shards", type=int, default=4, help="shards per split, for both")
    parser.add_argument("--compression", choices=("none", "gzip"), default="none")
    parser.add_argument(
        "--workers", type=int, default=min(4, os.cpu_count() or 1), help="worker processes of the multi-worker Beam run"
    )
    parser.add_argument("--no_multi", action="store_true", help="skip the multi-worker Beam run")
    parser.add_argument(
        "--repeats", type=int, default=2, help="alternate beam and plain this many times and keep each one's best time"
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. data.eval_fraction=0.2")
    args = parser.parse_args(argv)
    cfg = config_lib.load(args.config, args.overrides, registry=tasks)
    task, data = tasks.load(cfg.task), cfg.data
    if not os.path.isdir(args.input):
        raise UserError(f"{args.input} is not a local folder; run `make data` or point RAW at {task.raw_format}")

    with tempfile.TemporaryDirectory(prefix="bench_preprocess-") as scratch:
        scratch = Path(scratch)
        (scratch / "raw").mkdir()
        input_root, files = replicate(args.input, task, args.min_files, scratch / "raw")
        # Not timed: TensorFlow's import (the Example protos) and the decoders' plugins, which the
        # in-process Beam runner and the loop would otherwise pay for unequally.
        warm_up(input_root, task, data)
        common = (task, data, args.num_shards, args.compression)
        print(f"{files} raw files, {args.num_shards} shards per split, compression {args.compression}", flush=True)

        figures, plain_s = compare_one_worker(input_root, scratch, common, args.repeats)
        if not args.no_multi and args.workers > 1:
            figures.update(compare_multi_worker(input_root, scratch, common, args.workers, plain_s))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    preprocessing.quiet_beam_logging()
    run_cli(main, sys.argv[1:])
