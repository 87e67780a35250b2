"""Times the Beam preprocessing pipeline, in this process and in worker processes, against a plain
single-process loop on the same data, at a few sizes of input.

    python -m {{ cookiecutter.package }}.bench_preprocess --input data/raw --config configs/local.yaml \\
        [--sizes sample,20k,100k] [key=value ...]

At each size the three do the same work with the same functions (the task's `read_raw`,
`vocabularies`, `fit_encoding`, `encode` and `pack`, `preprocessing.write_tfrecords`) and write the
same shards, each to its own temporary folder; a raw input the task rejects is skipped by all, as
preprocessing does. The baselines `make preprocess` fits once the shards are written are left out
of all three.

- plain: one Python loop that lists, reads, decodes, encodes, groups by shard, packs and writes;
- in-process: `preprocessing.run` on the FnApiRunner in this process, listing, the final rename and
  the manifest included;
- multi-process (unless --no_multi): the same pipeline with --direct_num_workers=N
  --direct_running_mode=multi_processing, the start of its worker processes included.

`make preprocess` runs one of the two Beam runners, chosen by the input's size
(`preprocessing.choose_local_runner`); each size prints the one it picks beside the one that was
faster, and the end says where the worker processes overtook the in-process runner (the crossover).

Sizes: `sample` is the input as it is (with --min_files, its files copied up to that many); a
record count (`20000`, `20k`) or a size in bytes (`500MB`, `1GB`) is made by copying the input's
files, under new names, into a temporary folder until it holds about that many records (as many
per copy as the sample wrote) or bytes. Copies decode exactly like the originals; nothing is
downloaded; each size's folder is deleted once it is measured.

The last line printed is JSON: the largest size's figures ({"records", "beam_records_per_s" and
"ratio" of the faster Beam runner, "plain_records_per_s", "in_process_ratio", "multi_ratio",
"picks", ...}), the crossover, and "sizes", one entry per size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Sequence

from . import tasks
from .core import config as config_lib
from .core import preprocessing, topology
from .core.errors import UserError, run_cli
from .core.task import RawRejection, Rejected

IN_PROCESS, MULTI_PROCESS = "in-process", "multi-process"
DEFAULT_SIZES = "sample,20k,100k"
UNITS = {"kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_sizes(text: str) -> list[tuple[str, int]]:
    """[(kind, amount)] of --sizes: ("sample", 0) first, then ("records", n) and ("bytes", n) as given."""
    sizes = [("sample", 0)]
    for item in (part.strip().lower() for part in text.split(",") if part.strip()):
        records = re.fullmatch(r"(\d+(?:\.\d+)?)(k?)", item)
        size = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]b)", item)
        if item == "sample":
            continue
        if records:
            sizes.append(("records", int(float(records[1]) * (1000 if records[2] else 1))))
        elif size:
            sizes.append(("bytes", int(float(size[1]) * UNITS[size[2]])))
        else:
            raise UserError(
                f"--sizes: {item!r} is not a size; give `sample`, a record count (20000, 20k) or bytes (500MB, 1GB)"
            )
    return sizes


# ----------------------------------------------------------------------------- inputs


def replicate(input_root: str, task, copies: int, destination: Path) -> tuple[str, int]:
    """(`destination`, files in it): `copies` copies of each raw file of `input_root`, renamed
    `<stem>_copyN<ext>` in the same subfolders."""
    listing = task.list_raw(input_root)
    if listing.root and listing.root.rstrip("/") != input_root.rstrip("/"):
        raise UserError(f"{input_root} is an index of files elsewhere; benchmark larger sizes on a folder of raw files")
    for relative in listing.units:
        data = preprocessing.read_file(preprocessing.join(input_root, relative))
        folder, _, name = relative.rpartition("/")
        stem, dot, extension = name.rpartition(".") if "." in name else (name, "", "")
        (destination / folder).mkdir(parents=True, exist_ok=True)
        for copy in range(copies):
            (destination / folder / f"{stem}_copy{copy}{dot}{extension}").write_bytes(data)
    return str(destination), len(listing.units) * copies


def generated(input_root: str, task, copies: int, destination: Path, label: str) -> str:
    """A folder of `copies` copies of the input's files, made with a progress line."""
    started = time.perf_counter()
    print(f"-- {label}: writing {copies} copies of each file of {input_root} into {destination} ...", flush=True)
    destination.mkdir(parents=True)
    root, files = replicate(input_root, task, copies, destination)
    print(f"   {files:,} files in {time.perf_counter() - started:.1f}s", flush=True)
    return root


# ----------------------------------------------------------------------------- the plain loop


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


def plain_loop(input_root: str, output: str, task, data, num_shards: int | None, compression: str) -> int:
    """The same work as the pipeline (the shard counts, the task's `pack` and the final shard names
    included), in one process; returns the number of records written."""
    examples = read_all(input_root, task, data.eval_fraction)
    vocabularies = preprocessing.vocabulary_names(
        preprocessing.count_vocabularies(task, (example for _, example in examples))
    )
    shards = preprocessing.shard_counts(
        Counter(split for split, _ in examples), task.bytes_per_example(data), topology.topology().hosts, num_shards
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
        by_shard[(split, preprocessing.shard_of(example.source, shards[split]))].append(
            (preprocessing.order_key(example.source), record)
        )
    os.makedirs(output, exist_ok=True)
    written = 0
    for split in preprocessing.SPLITS:
        # Named as the pipeline's finalize names them: the split's shards that hold records, in order.
        keys = sorted(shard for each, shard in by_shard if each == split)
        for index, shard in enumerate(keys):
            name = f"{split}-{index:05d}-of-{len(keys):05d}{preprocessing.shard_suffix(compression)}"
            packed, _ = task.pack(split, [record for _, record in sorted(by_shard[(split, shard)])], data)
            written += preprocessing.write_tfrecords(preprocessing.join(output, name), packed, compression)[0]
    return written


# ----------------------------------------------------------------------------- Beam


def beam_args(workers: int) -> list[str]:
    """The runner options of the in-process (1 worker) or the multi-process run."""
    if workers == 1:
        return ["--runner=FnApiRunner", "--direct_num_workers=1"]
    return ["--runner=FnApiRunner", f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]


def run_beam(input_root: str, output: str, task, data, num_shards, compression: str, workers: int) -> int:
    status = preprocessing.run(
        input_root,
        output,
        task,
        data,
        beam_args(workers),
        topology.topology().hosts,
        num_shards,
        compression,
        baselines=False,
    )
    if status:
        raise RuntimeError(f"the pipeline exited with status {status}")
    with open(os.path.join(output, preprocessing.MANIFEST)) as handle:
        manifest = json.load(handle)
    return sum(split["num_examples"] for split in manifest["splits"].values())


def same_shards(first: Path, second: Path) -> bool:
    """Whether two output folders hold byte-identical shard files."""

    def shards(folder):
        return {p.name: p.read_bytes() for p in sorted(Path(folder).glob("*.tfrecord*"))}

    return shards(first) == shards(second)


def warm_up(input_root: str, task, common: tuple, scratch: Path) -> None:
    """Imports and first-use costs of this process (TensorFlow's protos, the decoders, the tokenizer
    library, Beam's runner) paid before timing: the plain loop and the in-process runner once on a
    few of the input's files. Worker processes pay theirs in every multi-process run (counted)."""
    units = task.list_raw(input_root).units[:60]
    folder = scratch / "warm-up" / "raw"
    for relative in units:
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(preprocessing.read_file(preprocessing.join(input_root, relative)))
    print(f"-- warm-up on {len(units)} files (not timed) ...", flush=True)
    try:
        plain_loop(str(folder), str(scratch / "warm-up" / "plain"), *common)
        run_beam(str(folder), str(scratch / "warm-up" / "beam"), *common, 1)
    except UserError as error:  # e.g. too few files for a train split: the timed runs say so themselves
        print(f"   warm-up skipped: {error}", flush=True)
    shutil.rmtree(scratch / "warm-up")


# ----------------------------------------------------------------------------- one size


def timed(label: str, function, *args) -> tuple[float, object]:
    print(f"-- {label} ...", flush=True)
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def picked_runner(task, input_root: str) -> tuple[str, int, str]:
    """(the runner `make preprocess` picks for this input, its workers, the line it prints)."""
    listing = task.list_raw(input_root)
    args, line = preprocessing.choose_local_runner(task, input_root, listing, [])
    workers = next((int(arg.split("=")[1]) for arg in args if arg.startswith("--direct_num_workers=")), 1)
    return (MULTI_PROCESS if workers > 1 else IN_PROCESS), workers, line


def measure(label: str, input_root: str, scratch: Path, task, common: tuple, workers: int, repeats: int) -> dict:
    """The three runs on one input, alternated `repeats` times (best time of each), their ratios to
    the plain loop and the runner `make preprocess` picks for it."""
    size = preprocessing.input_size(input_root, task.list_raw(input_root))
    print(f"== {label}: {size}", flush=True)
    runs = {"plain": 0, IN_PROCESS: 1, **({MULTI_PROCESS: workers} if workers > 1 else {})}
    times, records, failed = defaultdict(list), {}, []
    for repeat in range(1, max(1, repeats) + 1):
        # Alternated, so that a burst of load on a shared machine does not favour one side.
        for name, count in runs.items():
            output = str(scratch / name.replace("-", "_"))
            title = f"{label}, run {repeat} of {repeats}: "
            if name == "plain":
                seconds, records[name] = timed(f"{title}plain loop, 1 process", plain_loop, input_root, output, *common)
            else:
                what = "FnApiRunner in this process" if count == 1 else f"FnApiRunner, {count} worker processes"
                try:
                    seconds, records[name] = timed(
                        f"{title}beam, {what}", run_beam, input_root, output, task, *common[1:], count
                    )
                except Exception as error:  # the worker processes' run failed: reported, not timed
                    if name != MULTI_PROCESS:
                        raise
                    lines = [line for line in str(error).splitlines() if line.strip()] or [repr(error)]
                    failed.append(next((line for line in lines if "missing from the shards" in line), lines[-1]))
                    print(f"WARNING: the multi-process run failed: {failed[-1].strip()[:400]}", flush=True)
                    continue
            times[name].append(seconds)
        print("   " + ", ".join(f"{name} {values[-1]:.2f}s" for name, values in times.items()), flush=True)
    best = {name: min(values) for name, values in times.items()}
    if records[IN_PROCESS] != records["plain"] or not same_shards(scratch / "in_process", scratch / "plain"):
        raise RuntimeError(
            f"beam and the plain loop wrote different shards ({records[IN_PROCESS]} vs {records['plain']} records)"
        )
    figures = {
        "size": label.split("] ", 1)[-1],
        "files": size.files,
        "bytes": size.bytes,
        "records": records["plain"],
        "plain_s": round(best["plain"], 2),
        "plain_records_per_s": round(records["plain"] / best["plain"], 1),
        "in_process_s": round(best[IN_PROCESS], 2),
        "in_process_ratio": round(best["plain"] / best[IN_PROCESS], 3),
    }
    if MULTI_PROCESS in runs:
        identical = not failed and same_shards(scratch / "multi_process", scratch / "plain")
        if not identical and not failed:  # e.g. protobuf map fields serialized in a per-process order
            print(
                f"WARNING: the worker processes wrote other shards than this process ({records[MULTI_PROCESS]:,} "
                f"records, against {records['plain']:,})",
                flush=True,
            )
        figures["multi_identical_shards"] = identical
        if failed:
            figures["multi_failed"] = failed
    if MULTI_PROCESS in best:
        figures.update(multi_s=round(best[MULTI_PROCESS], 2), multi_ratio=round(best["plain"] / best[MULTI_PROCESS], 3))
    faster = min((name for name in best if name != "plain"), key=best.get)
    picks, picks_workers, line = picked_runner(task, input_root)
    figures.update(faster=faster, picks=picks, picks_workers=picks_workers)
    print(f"   make preprocess: {line}", flush=True)
    beam = ", ".join(
        f"beam {name} {records[name] / best[name]:,.0f} records/s ({best['plain'] / best[name]:.2f}x)"
        for name in best
        if name != "plain"
    )
    same = figures.get("multi_identical_shards", True)
    shards = "identical shards" if same else "the worker processes wrote other shards"
    print(
        f"{label}: {records['plain']:,} records, {size}; best of {max(1, repeats)}: plain loop "
        f"{figures['plain_records_per_s']:,.0f} records/s; {beam} the plain loop; {shards}; "
        f"faster: {faster}; make preprocess picks {picks}",
        flush=True,
    )
    for name in ("plain", "in_process", "multi_process"):
        shutil.rmtree(scratch / name, ignore_errors=True)
    return figures


def crossover(measured: list[dict]) -> tuple[float | None, str]:
    """(the input bytes from which the worker processes stayed faster than the in-process runner,
    interpolated between the two sizes around it, or None; a sentence saying so)."""
    points = sorted((size["bytes"], size["multi_s"] - size["in_process_s"]) for size in measured if "multi_s" in size)
    if not points:
        return None, "no multi-process runs (--no_multi)"
    largest = preprocessing.megabytes(points[-1][0])
    if points[-1][1] >= 0:
        return None, f"the in-process runner was as fast or faster at the largest size measured, {largest}"
    # The worker processes stay faster from the last size at which they were not.
    last = max((index for index, (_, slower) in enumerate(points) if slower >= 0), default=None)
    if last is None:
        return (
            None,
            f"worker processes were faster at every size measured, from {preprocessing.megabytes(points[0][0])}",
        )
    (low, slower), (high, faster) = points[last], points[last + 1]
    at = low + (high - low) * slower / (slower - faster)
    return at, (
        f"worker processes overtook the in-process runner between {preprocessing.megabytes(low)} and "
        f"{preprocessing.megabytes(high)} of input: at about {preprocessing.megabytes(at)} (interpolated)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help=f"raw data, {tasks.load(tasks.DEFAULT).raw_format} (local)")
    parser.add_argument("--config", help="config file whose data.* keys to use")
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help="comma-separated: sample (the input), record counts (20000, 20k) and sizes in bytes (500MB, 1GB) "
        f"made from copies of the input's files (default {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--min_files", type=int, default=0, help="the sample size: the input's files copied up to this many"
    )
    parser.add_argument(
        "--num_shards", type=int, help="shards per split, for all (default: from the data size, as make preprocess)"
    )
    parser.add_argument("--compression", choices=("none", "gzip"), default="none")
    parser.add_argument(
        "--workers",
        type=int,
        default=max(2, min(preprocessing.usable_cpus(), preprocessing.MAX_LOCAL_WORKERS)),
        help="worker processes of the multi-process Beam run (default: as make preprocess, one per CPU)",
    )
    parser.add_argument("--no_multi", action="store_true", help="skip the multi-process Beam run")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="alternate the runs this many times at each size and keep each one's best",
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. data.eval_fraction=0.2")
    args = parser.parse_args(argv)
    cfg = config_lib.load(args.config, args.overrides, registry=tasks)
    task, data = tasks.load(cfg.task), cfg.data
    if not os.path.isdir(args.input):
        raise UserError(f"{args.input} is not a local folder; run `make data` or point RAW at {task.raw_format}")
    sizes = parse_sizes(args.sizes)
    workers = 1 if args.no_multi else args.workers
    common = (task, data, args.num_shards, args.compression)
    cpus = preprocessing.usable_cpus()
    print(
        f"{len(sizes)} sizes ({args.sizes}), {cpus} CPUs, multi-process runs with {workers} workers, "
        f"shards per split: {args.num_shards or 'from the data size'}, compression {args.compression}",
        flush=True,
    )

    measured = []
    with tempfile.TemporaryDirectory(prefix="bench_preprocess-") as scratch:
        scratch = Path(scratch)
        sample_root, files = args.input, len(task.list_raw(args.input).units)
        if files < args.min_files:
            copies = math.ceil(args.min_files / files)
            sample_root = generated(args.input, task, copies, scratch / "sample", f"sample ({args.min_files} files)")
        sample_bytes = preprocessing.input_size(sample_root, task.list_raw(sample_root)).bytes
        warm_up(sample_root, task, common, scratch)
        for index, (kind, amount) in enumerate(sizes, 1):
            label = f"[{index}/{len(sizes)}] " + (
                "sample"
                if kind == "sample"
                else f"{amount:,} records"
                if kind == "records"
                else preprocessing.megabytes(amount)
            )
            root = sample_root
            if kind != "sample":
                per_copy = measured[0]["records"] if kind == "records" else sample_bytes
                copies = max(1, math.ceil(amount / max(1, per_copy)))
                root = generated(sample_root, task, copies, scratch / f"size-{index}", label)
            measured.append(measure(label, root, scratch, task, common, workers, args.repeats))
            if kind != "sample":
                shutil.rmtree(root)

    at, sentence = crossover(measured)
    largest = max(measured, key=lambda size: size["bytes"])
    threshold = task.multi_process_from_bytes
    print(
        f"crossover: {sentence}; make preprocess switches to worker processes at "
        + (
            f"{preprocessing.megabytes(threshold)} (task {task.name}'s multi_process_from_bytes)"
            if threshold
            else f"no size (task {task.name} sets no multi_process_from_bytes)"
        ),
        flush=True,
    )
    best = largest["faster"]
    best_s = largest["in_process_s"] if best == IN_PROCESS else largest["multi_s"]
    figures = {
        "records": largest["records"],
        "bytes": largest["bytes"],
        "plain_records_per_s": largest["plain_records_per_s"],
        "beam_records_per_s": round(largest["records"] / best_s, 1),
        "ratio": round(largest["plain_s"] / best_s, 3),
        "runner": best,
        "in_process_ratio": largest["in_process_ratio"],
        **({"multi_ratio": largest["multi_ratio"], "workers": workers} if "multi_ratio" in largest else {}),
        "picks": largest["picks"],
        "picks_the_faster": largest["picks"] == best,
        "multi_identical_shards": all(size.get("multi_identical_shards", True) for size in measured),
        "crossover_bytes": None if at is None else round(at),
        "threshold_bytes": threshold,
        "cpus": cpus,
        "sizes": measured,
    }
    print(
        f"largest size: beam ({best}) at {figures['ratio']:.2f}x the plain loop; make preprocess picks "
        f"{largest['picks']}{'' if figures['picks_the_faster'] else ', not the faster'}",
        flush=True,
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    preprocessing.quiet_beam_logging()
    run_cli(main, sys.argv[1:])
