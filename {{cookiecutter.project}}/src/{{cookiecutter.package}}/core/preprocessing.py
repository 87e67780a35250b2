"""Offline preprocessing in Apache Beam: raw data -> sharded TFRecords + manifest.json.

(`python -m {{ cookiecutter.package }}.preprocess` runs it: preprocess.py.)

This module is the record plumbing every task shares; the task (tasks/) says how raw files are
listed and read, how one example is encoded, and, when it needs one, what is learned from the
train split first (a tokenizer). The steps:

    list RAW (driver) -> read files -> split by stable hash -> [count each vocabulary's names]
    -> [fit the encoding on a bounded train sample] -> encode each example -> group by shard
    -> [the task packs a shard's examples into records] -> write shards -> finalize (manifest last)

A raw input that cannot become an example (empty, truncated, not decodable, malformed) is
rejected with its source and reason into rejected.jsonl and counted by reason in the manifest and
in the Beam metrics; files that are not raw input are ignored (and counted). A bad input never
fails the job.

Guarantees:
- Deterministic: the split and the shard of an example come from a stable hash of its source,
  each shard is written in the order of another stable hash (so no shard is a run of one label),
  and the encoding fit's sample is chosen by hash too: two runs give identical files.
- Exact: the manifest's counts are the records actually written to each split's shards.
- Never partial: shards are written to a temporary folder; only when all are final does one last
  step replace the previous output and write manifest.json, last.

Files are read in batches (one Beam element per batch of files) and records are grouped by shard
within each bundle before the single shuffle that sharded writing needs: per-element overhead is
what makes a naive Beam job slow on small examples (`make bench-preprocess` measures it).

"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import struct
import time
import uuid
from collections import Counter, defaultdict
from typing import Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

from . import gcp, topology
from .errors import UserError
from .task import Listing, RawRejection, Rejected

SPLITS = ("train", "eval")
MANIFEST = "manifest.json"
REJECTED = "rejected.jsonl"
FILES_PER_ELEMENT = 128
NAMESPACE = "preprocess"
SHARD_PATTERNS = ("*-?????-of-?????.tfrecord", "*-?????-of-?????.tfrecord.gz")


# ----------------------------------------------------------------------------- stable hashing


def _hash_unit(relative_path: str, salt: bytes) -> float:
    digest = hashlib.sha256(salt + relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(relative_path: str, eval_fraction: float) -> str:
    """'eval' for a stable `eval_fraction` share of paths, else 'train'."""
    return "eval" if _hash_unit(relative_path, b"split:") < eval_fraction else "train"


def shard_of(relative_path: str, num_shards: int) -> int:
    return int(_hash_unit(relative_path, b"shard:") * num_shards)


def order_key(source: str) -> float:
    """Position of an example inside its shard: a stable hash, so that a shard is neither in
    label order (sorted paths start with the label folder) nor different between runs."""
    return _hash_unit(source, b"order:")


# ----------------------------------------------------------------------------- reading and encoding


def join(root: str, *parts: str) -> str:
    return FileSystems.join(root.rstrip("/"), *parts)


def locate(root: str, path: str) -> str:
    """`path` under `root`, unless it is a full path or URI already (a CSV index names its own)."""
    return path if path.startswith("/") or "://" in path else join(root, path)


def read_file(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


def rejection(source: str, reason: str, detail: str) -> dict:
    Metrics.counter(NAMESPACE, f"rejected_{reason}").inc()
    return {"source": source, "reason": reason, "detail": detail}


class ReadFiles(beam.DoFn):
    """Reads a batch of listed files; emits (split, RawExample) and, tagged, the rejected inputs."""

    def __init__(self, task, input_root: str, eval_fraction: float):
        self.task, self.input_root, self.eval_fraction = task, input_root.rstrip("/"), eval_fraction
        self.read = Metrics.counter(NAMESPACE, "read")

    def process(self, relative_paths: Sequence[str]):
        for relative in relative_paths:
            data = read_file(locate(self.input_root, relative))
            self.read.inc()
            for item in self.task.read_raw(relative, data):
                if isinstance(item, RawRejection):
                    yield beam.pvalue.TaggedOutput(
                        "rejected", rejection(locate(self.input_root, item.source), item.reason, item.detail)
                    )
                else:  # the raw input may decide the split itself (a CSV index's ML_USE column)
                    yield item.split or split_of(item.source, self.eval_fraction), item


LARGEST = 5
"""The largest examples of each split the manifest lists (by the task's size statistic)."""


class EncodeExamples(beam.DoFn):
    """Encodes examples; emits ((split, shard), [(order, record), ...]) per bundle, the rejected
    inputs, the task's additive statistics, each record's (split, digest) for counting exact
    duplicates, and each split's total and largest examples by the task's size statistic (tagged)."""

    def __init__(self, task, input_root: str, data, num_shards: int | None, reading_hosts: int):
        self.task, self.input_root, self.data = task, input_root.rstrip("/"), data
        self.num_shards, self.reading_hosts = num_shards, reading_hosts
        self.encoded = Metrics.counter(NAMESPACE, "encoded")

    def start_bundle(self):
        self.by_shard = defaultdict(list)
        self.stats = defaultdict(float)
        self.sizes = Sizes()

    def process(self, element, vocabularies: dict, counts: dict, artifacts: dict):
        split, example = element
        try:
            record, stats = self.task.encode(example, self.data, vocabularies, artifacts)
        except Rejected as error:
            yield beam.pvalue.TaggedOutput(
                "rejected",
                rejection(locate(self.input_root, example.source), error.reason, error.detail or error.reason),
            )
            return
        shards = shard_counts(counts, self.task.bytes_per_example(self.data), self.reading_hosts, self.num_shards)
        self.by_shard[(split, shard_of(example.source, shards[split]))].append((order_key(example.source), record))
        for key, value in stats.items():
            self.stats[key] += value
        if getattr(self.task, "size_statistic", ""):
            self.sizes.add(
                split, locate(self.input_root, example.source), float(stats.get(self.task.size_statistic, 0))
            )
        yield beam.pvalue.TaggedOutput("digests", (split, hashlib.sha256(record).digest()[:16]))
        self.encoded.inc()

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue

        for key, records in self.by_shard.items():
            yield WindowedValue((key, records), 0, [GlobalWindow()])
        if self.stats:
            yield beam.pvalue.TaggedOutput("stats", WindowedValue(dict(self.stats), 0, [GlobalWindow()]))
        if self.sizes.totals:
            yield beam.pvalue.TaggedOutput("sizes", WindowedValue(self.sizes, 0, [GlobalWindow()]))


def share(part: float, whole: float) -> float:
    return round(part / whole, 6) if whole else 0.0


@dataclasses.dataclass
class Sizes:
    """Each split's total of the task's size statistic and its LARGEST examples by it, [(size,
    source)] largest first; several merge into one (`merged`)."""

    totals: dict = dataclasses.field(default_factory=lambda: defaultdict(float))
    largest: dict = dataclasses.field(default_factory=lambda: defaultdict(list))

    def add(self, split: str, source: str, size: float) -> None:
        self.totals[split] += size
        self.keep(split, size, source)

    def keep(self, split: str, size: float, source: str) -> None:
        kept = self.largest[split]
        kept.append((size, source))
        kept.sort(key=lambda item: (-item[0], item[1]))
        del kept[LARGEST:]

    @staticmethod
    def merged(parts: Iterable["Sizes"]) -> "Sizes":
        whole = Sizes()
        for part in parts:
            for split, total in part.totals.items():
                whole.totals[split] += total
            for split, kept in part.largest.items():
                for size, source in kept:
                    whole.keep(split, size, source)
        return whole

    def manifest(self) -> dict:
        """{split: {"total": ..., "largest": [{"source", "size", "share"}]}} for the manifest."""
        return {
            split: {
                "total": self.totals[split],
                "largest": [
                    {"source": source, "size": size, "share": share(size, self.totals[split])}
                    for size, source in self.largest[split]
                ],
            }
            for split in SPLITS
            if split in self.totals
        }


def vocabulary_entries(task, example) -> Iterator[tuple[str, str]]:
    """(field, name) for each category name `example` holds, as the task's `vocabularies` gives them."""
    for field, names in task.vocabularies(example).items():
        if isinstance(names, (str, bytes)):  # would count each of its characters as a name
            raise TypeError(
                f"task {task.name}: vocabularies() gave field {field!r} of {example.source} as one "
                f"{type(names).__name__}, not a list of names; give a list of names, e.g. [example.target]"
            )
        for name in names:
            if not isinstance(name, str):
                raise TypeError(
                    f"task {task.name}: vocabularies() gave {name!r} ({type(name).__name__}) in field "
                    f"{field!r} of {example.source}; category names must be strings"
                )
            yield field, str(name)  # a subclass (numpy.str_) as the plain string the manifest writes


def vocabulary_counts(counted: Iterable[tuple[tuple[str, str], int]]) -> dict[str, dict[str, int]]:
    """{field: {name: count}}, fields and names sorted, from ((field, name), count) pairs: the
    manifest's `vocabularies`."""
    found = defaultdict(dict)
    for (field, name), count in sorted(counted):
        found[field][name] = count
    return dict(found)


def vocabulary_names(counts: dict[str, dict[str, int]]) -> dict[str, list[str]]:
    """{field: sorted names}: the vocabularies `encode` and `manifest_fields` get (a manifest's own
    `vocabularies` give them back)."""
    return {field: sorted(names) for field, names in counts.items()}


def count_vocabularies(task, examples: Iterable) -> dict[str, dict[str, int]]:
    """The manifest's `vocabularies` of `examples`, counted in this process (what the pipeline's
    VocabularyNames..Vocabularies steps count in Beam)."""
    entries = Counter(entry for example in examples for entry in vocabulary_entries(task, example))
    return vocabulary_counts(entries.items())


def shard_counts(counts: dict, bytes_per_example: int, reading_hosts: int, num_shards: int | None) -> dict:
    """Shards per split: --num_shards, or sized from the split's examples."""
    return {
        split: num_shards or topology.choose_num_shards(counts.get(split, 0), bytes_per_example, reading_hosts)
        for split in SPLITS
    }


def sum_stats(stats: Iterable[dict]) -> dict:
    total = defaultdict(float)
    for each in stats:
        for key, value in each.items():
            total[key] += value
    return dict(total)


def fit_artifacts(sample: list, task, data, workdir: str) -> dict:
    """The task's fitted encoding artifacts (e.g. a tokenizer) from the bounded, hash-chosen train sample."""
    return task.fit_encoding([payload for _, payload in sorted(sample)], data, workdir)


# ----------------------------------------------------------------------------- writing


def _masked_crc32c(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_tfrecords(path: str, records: Iterable[bytes], compression: str) -> tuple[int, int]:
    """Writes records in the TFRecord format; returns (records, bytes of payload)."""
    kind = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    count = size = 0
    with FileSystems.create(path, mime_type="application/octet-stream", compression_type=kind) as handle:
        for record in records:
            length = struct.pack("<Q", len(record))
            handle.write(
                length + struct.pack("<I", _masked_crc32c(length)) + record + struct.pack("<I", _masked_crc32c(record))
            )
            count += 1
            size += len(record)
    return count, size


def shard_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


class WriteShard(beam.DoFn):
    """Writes one shard, in the order of `order_key`, into the temporary folder: the records the
    task's `pack` makes of the shard's examples (by default the examples themselves)."""

    def __init__(self, task, data, temp_dir: str, compression: str):
        self.task, self.data = task, data
        self.temp_dir = temp_dir
        self.compression = compression
        self.written = Metrics.counter(NAMESPACE, "written")

    def process(self, element):
        (split, shard), groups = element
        pairs = sorted(pair for group in groups for pair in group)
        records, stats = self.task.pack(split, [record for _, record in pairs], self.data)
        path = join(self.temp_dir, f"{split}-shard-{shard:05d}{shard_suffix(self.compression)}")
        count, size = write_tfrecords(path, records, self.compression)
        self.written.inc(count)
        yield {
            "split": split,
            "shard": shard,
            "path": path,
            "num_examples": count,
            "num_sources": len(pairs),
            "bytes": size,
            "stats": stats,
        }


def finalize(
    _,
    shards: list,
    rejected: list,
    stats: list,
    vocabularies: dict,
    artifacts: dict,
    sizes: list = (),
    duplicates: dict | None = None,
    *,
    task,
    data,
    output: str,
    temp_dir: str,
    compression: str,
    ignored: int,
    input_root: str,
) -> dict:
    """Replaces the previous output with the new shards, then writes the manifest last."""
    output = output.rstrip("/")
    old_manifest = join(output, MANIFEST)
    if FileSystems.exists(old_manifest):
        FileSystems.delete([old_manifest])  # from here on no manifest describes a mixed folder
    old = [
        m.path
        for pattern in (*SHARD_PATTERNS, REJECTED, f"{MANIFEST}{TEMPORARY}*")  # a killed write's manifest
        for m in FileSystems.match([join(output, pattern)])[0].metadata_list
    ]
    if old:
        FileSystems.delete(old)

    splits = {}
    sources, destinations = [], []
    for split in SPLITS:
        written = sorted((s for s in shards if s["split"] == split), key=lambda s: s["shard"])
        names = [
            f"{split}-{index:05d}-of-{len(written):05d}{shard_suffix(compression)}" for index in range(len(written))
        ]
        sources += [s["path"] for s in written]
        destinations += [join(output, name) for name in names]
        splits[split] = {
            "num_examples": sum(s["num_examples"] for s in written),
            # the encoded raw examples: the records themselves, unless the task packs several into one
            "num_sources": sum(s["num_sources"] for s in written),
            "files": names,
            "examples_per_file": [s["num_examples"] for s in written],
            "bytes": sum(s["bytes"] for s in written),
        }
    if sources:
        FileSystems.rename(sources, destinations)

    rejected = sorted(rejected, key=lambda r: r["source"])
    with FileSystems.create(join(output, REJECTED), mime_type="application/json") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rejected).encode("utf-8"))
    by_reason = defaultdict(int)
    for record in rejected:
        by_reason[record["reason"]] += 1
    for name, content in sorted(artifacts.items()):  # e.g. the tokenizer the shards were encoded with
        with FileSystems.create(join(output, name), mime_type="application/octet-stream") as handle:
            handle.write(content)

    manifest = {
        "task": task.name,
        "source": input_root,
        "splits": splits,
        "feature_spec": task.feature_spec(data),
        **task.manifest_fields(
            sum_stats([*stats, *(s["stats"] for s in shards)]), data, artifacts, vocabulary_names(vocabularies)
        ),
        "vocabularies": vocabularies,
        "eval_fraction": data.eval_fraction,
        "compression": compression,
        "artifacts": sorted(artifacts),
        "rejected": {"count": len(rejected), "by_reason": dict(sorted(by_reason.items())), "file": REJECTED},
        "ignored_files": ignored,
        # Encoded examples equal to an earlier one of their split (kept: the raw data decides).
        "duplicates": {split: int((duplicates or {}).get(split, 0)) for split in SPLITS},
    }
    if getattr(task, "size_statistic", ""):
        manifest["sizes"] = {"statistic": task.size_statistic, **Sizes.merged(sizes).manifest()}
    write_manifest(output, manifest)
    remove_temp_folders(output, temp_dir)
    return manifest


TEMPORARY = ".tmp-"
"""What `write_manifest` appends to the manifest's path for the file it renames over it (as
`run_dir.write_atomically` does: the same pattern marks a killed write's leftover)."""


def write_manifest(output: str, manifest: dict) -> None:
    """Writes manifest.json whole or not at all: a reader, or a run killed or out of disk mid-write,
    finds the previous manifest or the new one, never a part of one. The content goes to a temporary
    file beside it, which then replaces it (POSIX rename on a local disk; on gs:// a copy, which makes
    the object's new generation in one step, then a delete). Through Beam's file systems: the worker
    that finalizes the job imports no TensorFlow. A failed write removes its temporary file."""
    path = join(output, MANIFEST)
    temporary = f"{path}{TEMPORARY}{uuid.uuid4().hex[:8]}"
    try:
        with FileSystems.create(temporary, mime_type="application/json") as handle:
            handle.write(json.dumps(manifest, indent=2).encode("utf-8"))
        FileSystems.rename([temporary], [path])
    except BaseException:
        if FileSystems.exists(temporary):
            FileSystems.delete([temporary])
        raise


def remove_temp_folders(output: str, temp_dir: str) -> None:
    """Removes this run's (now empty) temporary folder and the files of any that an interrupted
    earlier run left behind."""
    leftovers = [m.path for m in FileSystems.match([join(output, ".tmp-*", "*")])[0].metadata_list]
    if leftovers:
        FileSystems.delete(leftovers)
    folders = {temp_dir, *(path.rsplit("/", 1)[0] for path in leftovers)}
    existing = [folder for folder in folders if FileSystems.exists(folder)]  # local only: GCS has no folders
    if existing:
        FileSystems.delete(existing)


# ----------------------------------------------------------------------------- pipeline


def build_pipeline(
    pipeline: beam.Pipeline,
    input_root: str,
    output: str,
    task,
    data,
    reading_hosts: int = 1,
    num_shards: int | None = None,
    compression: str = "none",
    listing: Listing | None = None,
) -> dict:
    """Adds `task`'s preprocessing steps to `pipeline`; returns what the driver learned from listing
    (`listing`, when the driver listed RAW already)."""
    listing = listing or task.list_raw(input_root)
    root = listing.root or input_root  # what units and sources are relative to
    temp_dir = join(output, f".tmp-{uuid.uuid4().hex[:12]}")
    batches = [listing.units[i : i + FILES_PER_ELEMENT] for i in range(0, len(listing.units), FILES_PER_ELEMENT)]

    read = (
        pipeline
        | "ListedFiles" >> beam.Create(batches)
        | "Read" >> beam.ParDo(ReadFiles(task, root, data.eval_fraction)).with_outputs("rejected", main="examples")
    )
    examples = read.examples
    # Each category name of each example with its count over the whole input, by field; none for a
    # task without vocabularies.
    vocabularies = (
        examples
        | "VocabularyNames" >> beam.FlatMap(lambda element: vocabulary_entries(task, element[1]))
        | "CountNames" >> beam.combiners.Count.PerElement()
        | "AllNames" >> beam.combiners.ToList()
        | "Vocabularies" >> beam.Map(vocabulary_counts)
    )
    counts = (
        examples
        | "Splits" >> beam.Map(lambda element: element[0])
        | "CountPerSplit" >> beam.combiners.Count.PerElement()
    )
    if task.needs_encoding_fit:
        # A bounded sample of the train split, chosen by hash so that the fit is deterministic.
        artifacts = (
            examples
            | "TrainOnly" >> beam.Filter(lambda element: element[0] == "train")
            | "FitKey" >> beam.Map(lambda element: (_hash_unit(element[1].source, b"fit:"), element[1].payload))
            | "FitSample" >> beam.combiners.Top.Smallest(task.encoding_sample_size(data))
            | "FitEncoding" >> beam.Map(fit_artifacts, task=task, data=data, workdir=temp_dir)
        )
    else:
        artifacts = pipeline | "NoArtifacts" >> beam.Create([{}])

    encoded = examples | "Encode" >> beam.ParDo(
        EncodeExamples(task, root, data, num_shards, reading_hosts),
        vocabularies=beam.pvalue.AsSingleton(vocabularies | "SortedNames" >> beam.Map(vocabulary_names)),
        counts=beam.pvalue.AsDict(counts),
        artifacts=beam.pvalue.AsSingleton(artifacts),
    ).with_outputs("rejected", "stats", "digests", "sizes", main="records")
    # Exact duplicates: the records that equal an earlier one of their split (by digest).
    duplicates = (
        encoded.digests
        | "CountDigests" >> beam.combiners.Count.PerElement()
        | "Repeats" >> beam.Map(lambda item: (item[0][0], item[1] - 1))
        | "DuplicatesPerSplit" >> beam.CombinePerKey(sum)
    )
    written = (
        encoded.records
        | "GroupByShard" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShard(task, data, temp_dir, compression))
    )
    rejected = (read.rejected, encoded.rejected) | "AllRejected" >> beam.Flatten()
    _ = (
        pipeline
        | "Once" >> beam.Create([None])
        | "ReplaceOutputWriteManifest"
        >> beam.Map(
            finalize,
            shards=beam.pvalue.AsList(written),
            rejected=beam.pvalue.AsList(rejected),
            stats=beam.pvalue.AsList(encoded.stats),
            sizes=beam.pvalue.AsList(encoded.sizes),
            duplicates=beam.pvalue.AsDict(duplicates),
            vocabularies=beam.pvalue.AsSingleton(vocabularies),
            artifacts=beam.pvalue.AsSingleton(artifacts),
            task=task,
            data=data,
            output=output,
            temp_dir=temp_dir,
            compression=compression,
            ignored=listing.ignored,
            input_root=input_root,
        )
    )
    return {"files": len(listing.units), "ignored": listing.ignored}


def print_metrics(result) -> dict:
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query()["counters"]
        if c.key.metric.namespace == NAMESPACE
    }
    rejected = {k[len("rejected_") :]: v for k, v in counters.items() if k.startswith("rejected_")}
    print(
        f"read {counters.get('read', 0)}, written {counters.get('written', 0)}, "
        f"rejected {sum(rejected.values())} {rejected or ''}".rstrip()
    )
    return counters


def print_dry_run(pipeline: beam.Pipeline, options: PipelineOptions, result) -> None:
    """What `--dry_run=True` would have submitted: the options, the job and its steps."""
    from apache_beam.portability.api import beam_runner_api_pb2

    print(
        f"dry run: the job was built{' and validated' if result is not None else ''}; nothing was "
        f"submitted or run. Pipeline options:"
    )
    for name, value in sorted(options.get_all_options(drop_default=True).items()):
        print(f"  --{name}={value}")
    steps = [part.full_label for part in pipeline.transforms_stack[0].parts]
    print(f"steps: {' -> '.join(steps)}")
    job = getattr(result, "job", None)
    if job is not None:  # DataflowRunner: the apiclient.Job and the portable pipeline it carries
        print(f"job: {job.proto.name}, {len(str(job))} bytes of job JSON before submission")
    proto = getattr(pipeline.runner, "proto_pipeline", None) if result is not None else None
    if proto is not None:
        print(f"pipeline proto: {len(proto.components.transforms)} transforms, {len(proto.SerializeToString())} bytes")
        for environment in proto.components.environments.values():
            if environment.urn == "beam:env:docker:v1":
                image = beam_runner_api_pb2.DockerPayload.FromString(environment.payload).container_image
                print(f"worker image: {image}")
            staged = [
                beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(a.role_payload).staged_name
                for a in environment.dependencies
                if a.role_payload
            ]
            if staged:
                print(f"staged for the workers: {', '.join(staged)}")


def check_dataflow_paths(options: PipelineOptions, *paths: str) -> None:
    """Dataflow workers cannot see this machine's disk: refuse local paths before staging anything."""
    runner = options.view_as(StandardOptions).runner or ""
    if "dataflow" in runner.lower():
        local = [path for path in paths if not path.startswith("gs://")]
        if local:
            raise UserError(
                f"with the DataflowRunner, --input and --output must be gs:// paths, got "
                f"{', '.join(local)}; upload the raw data (gcloud storage cp -r) and set "
                f"RAW=gs://... DATA_DIR=gs://..."
            )


# ----------------------------------------------------------------------------- the local runner

RUNNER_OPTIONS = ("--runner", "--direct_num_workers", "--direct_running_mode")
"""Beam options that choose the runner: one given by the user is used as given."""
MAX_LOCAL_WORKERS = 8
"""Worker processes at most: every element crosses the runner's own process between stages."""


@dataclasses.dataclass(frozen=True)
class InputSize:
    files: int
    bytes: int

    def __str__(self) -> str:
        return f"{megabytes(self.bytes)} in {self.files:,} files"


def megabytes(count: float) -> str:
    return f"{count / 1e6:,.1f} MB" if count < 1e9 else f"{count / 1e9:,.2f} GB"


def input_size(input_root: str, listing: Listing) -> InputSize:
    """Files and bytes of the listed raw input (local or gs://), from one listing of its folder's
    sizes: no file is opened. Listed files outside that folder (a CSV index may name any path) count
    at the mean size of the others."""
    root = (listing.root or input_root).rstrip("/")
    sizes = {m.path: m.size_in_bytes for m in FileSystems.match([join(root, "**")])[0].metadata_list}
    found = [sizes[path] for path in (locate(root, unit) for unit in listing.units) if path in sizes]
    total = sum(found)
    if found and len(found) < len(listing.units):
        total += (len(listing.units) - len(found)) * total // len(found)
    return InputSize(len(listing.units), total)


def given_runner_options(beam_args: Sequence[str]) -> list[str]:
    """The runner options among Beam's arguments, as given (`--runner=X`, or `--runner X`)."""
    given = []
    for index, arg in enumerate(beam_args):
        if arg.split("=", 1)[0] in RUNNER_OPTIONS:
            value = "=" not in arg and index + 1 < len(beam_args) and not beam_args[index + 1].startswith("--")
            given.append(f"{arg} {beam_args[index + 1]}" if value else arg)
    return given


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def choose_local_runner(
    task, input_root: str, listing: Listing, beam_args: Sequence[str], cpus: int | None = None
) -> tuple[list[str], str]:
    """(Beam's arguments with the local runner for this input, the line saying which and why).

    Worker processes (--direct_running_mode=multi_processing) each start a Python process and load
    the task's code, and every element crosses the runner's process between stages: they pay back
    only above a size of input, which depends on the work per byte of the task. The task says from
    which size (`multi_process_from_bytes`, measured with `make bench-preprocess`); without one, or
    with one CPU, the job runs in this process. Runner options the user gave win, on the FnApiRunner
    unless they name a --runner (Beam's default runner may download one: see `run`)."""
    given = given_runner_options(beam_args)
    if given:
        if any(arg.split("=", 1)[0] == "--runner" for arg in beam_args):
            return list(beam_args), f"runner: as given ({' '.join(given)})"
        return [*beam_args, "--runner=FnApiRunner"], f"runner: FnApiRunner, options as given ({' '.join(given)})"
    threshold = task.multi_process_from_bytes
    if threshold is None:
        why = f"task {task.name} names no input size from which worker processes pay back their start"
        return [*beam_args, "--runner=FnApiRunner"], f"runner: FnApiRunner in this process: {why}"
    cpus = cpus or usable_cpus()
    size = input_size(input_root, listing)
    if cpus >= 2 and size.bytes >= threshold:
        workers = min(cpus, MAX_LOCAL_WORKERS)
        return [
            *beam_args,
            "--runner=FnApiRunner",
            f"--direct_num_workers={workers}",
            "--direct_running_mode=multi_processing",
        ], (
            f"runner: FnApiRunner, {workers} worker processes: the input, {size}, is at least the "
            f"{megabytes(threshold)} from which worker processes pay back their start for task {task.name}"
        )
    if cpus < 2:
        why = f"the input is {size}, on 1 CPU"
    else:
        why = (
            f"the input, {size}, is below the {megabytes(threshold)} from which worker processes "
            f"pay back their start for task {task.name}"
        )
    return [*beam_args, "--runner=FnApiRunner"], f"runner: FnApiRunner in this process: {why}"


def run(
    input_root: str,
    output: str,
    task,
    data,
    beam_args: Sequence[str],
    reading_hosts: int,
    num_shards: int | None = None,
    compression: str = "none",
    baselines: bool = True,
) -> int:
    """Builds and runs `task`'s job (`beam_args` are Beam's pipeline options), prints what it wrote
    and, with `baselines`, adds the task's baselines to the manifest.

    Without a runner option the job runs on the FnApiRunner, in this process or in worker processes
    as `choose_local_runner` decides from the input's size. (Beam's default, the DirectRunner, may
    hand the job to the Prism runner, which downloads a binary from GitHub on first use: that fails
    offline and on locked-down TPU VMs. The FnApiRunner has nothing to download.)"""
    # Without a --runner the FnApiRunner (which of its modes: decided below, once RAW is listed).
    named = any(arg.split("=", 1)[0] == "--runner" for arg in beam_args)
    options = PipelineOptions(beam_args if named else [*beam_args, "--runner=FnApiRunner"])
    check_dataflow_paths(options, input_root, output)
    # Beam parses --dry_run as a string: "False" must not count.
    dry_run = str(options.get_all_options().get("dry_run")).lower() in ("true", "1", "yes")
    on_dataflow = "dataflow" in (options.view_as(StandardOptions).runner or "").lower()
    cloud = options.view_as(GoogleCloudOptions)
    gcp.require_credentials(
        {
            "--input": input_root,
            "--output": output,
            "--temp_location": cloud.temp_location,
            "--staging_location": cloud.staging_location,
        },
        service="the Dataflow runner" if on_dataflow and not dry_run else None,
    )

    if not 0 < data.max_example_share <= 1:
        raise UserError(f"data.max_example_share must be in (0, 1], got {data.max_example_share}")
    started = time.perf_counter()
    listing = task.list_raw(input_root)
    beam_args, runner = choose_local_runner(task, input_root, listing, beam_args)
    options = PipelineOptions(beam_args)
    pipeline = beam.Pipeline(options=options)
    plan = build_pipeline(pipeline, input_root, output, task, data, reading_hosts, num_shards, compression, listing)
    # The folders are the ones passed (--input, --output), which may not be the config's data.raw and data.dir.
    settings = ", ".join(
        f"{key}={value}"
        for key, value in dataclasses.asdict(data).items()
        if key not in ("raw", "dir", "shuffle_buffer")
    )
    print(
        f"{plan['files']} input files in {input_root} ({plan['ignored']} other files ignored); {settings}", flush=True
    )
    print(runner, flush=True)
    if dry_run and not on_dataflow:  # only the DataflowRunner knows --dry_run; the others would run
        print_dry_run(pipeline, options, None)
        return 0
    result = pipeline.run()
    if dry_run:
        print_dry_run(pipeline, options, result)
        return 0
    result.wait_until_finish()
    elapsed = time.perf_counter() - started
    counters = print_metrics(result)
    with FileSystems.open(join(output, MANIFEST)) as handle:
        manifest = json.load(handle)
    total = sum(split["num_examples"] for split in manifest["splits"].values())
    per_split = ", ".join(
        f"{name} {split['num_examples']} in {len(split['files'])} shards" for name, split in manifest["splits"].items()
    )
    print(
        f"wrote {total} examples ({per_split}) "
        f"to {output} in {elapsed:.1f}s ({per_second(counters.get('read', 0), elapsed)} files/s); "
        f"rejected {manifest['rejected']['count']} {manifest['rejected']['by_reason'] or ''} "
        f"(listed in {REJECTED}); ignored {manifest['ignored_files']} other files",
        flush=True,
    )
    for line in describe_sizes(task, data, manifest):
        print(line, flush=True)
    if baselines:
        add_baselines(task, manifest, output)
    return 0


def describe_sizes(task, data, manifest: dict) -> list[str]:
    """What preprocessing says of the examples' copies and sizes: the exact duplicates of each split,
    each split's largest examples and their share of it (by the task's size statistic), and a line
    for each example over `data.max_example_share`, with the fix."""
    lines = []
    copies = {split: count for split, count in manifest.get("duplicates", {}).items() if count}
    if copies:
        lines.append(
            f"duplicates: {', '.join(f'{split} {count}' for split, count in copies.items())} exact copies of an "
            "earlier example of their split (kept: remove them from the raw data to train on each once)"
        )
    sizes = manifest.get("sizes") or {}
    statistic = sizes.get("statistic")
    for split in (split for split in SPLITS if split in sizes):
        largest = sizes[split]["largest"]
        lines.append(
            f"largest {split} examples by {statistic}: "
            + ", ".join(f"{entry['source']} {entry['share']:.1%}" for entry in largest)
        )
        for entry in (entry for entry in largest if entry["share"] > data.max_example_share):
            lines.append(
                f"flagged: {entry['source']} is {entry['share']:.1%} of the {split} split's {statistic} (over "
                f"data.max_example_share={data.max_example_share:g}): one example would be that much of what the "
                f"model {'trains on' if split == 'train' else 'is judged on'}; split it, cap it"
                + (f" ({task.size_advice})" if task.size_advice else "")
                + ", or drop it from the raw data"
            )
    return lines


def add_baselines(task, manifest: dict, output: str) -> None:
    """Fits `task`'s trivial baselines on the written train shards, scores them on the eval shards
    and adds them to the manifest (core/baselines.py)."""
    from . import baselines

    started = time.perf_counter()
    found = baselines.compute(task, manifest, output)
    if found is None:
        return
    write_manifest(output, {**manifest, "baselines": found})
    print(
        f"{baselines.describe(found)} (eval {found['metric']}; fitted on {found['train_records']} train records "
        f"in {time.perf_counter() - started:.1f}s): the model must beat the best",
        flush=True,
    )


def per_second(count: int, seconds: float) -> str:
    """A rate with the digits it needs: 234 for 234.4/s, 0.3 for 2 files in 6.7 s (never a bare 0)."""
    rate = count / seconds if seconds > 0 else 0.0
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"


def quiet_beam_logging() -> None:
    """Beam's INFO chatter off, and the "No semi_persistent_directory found" warning that each
    worker of --direct_running_mode=multi_processing sends back through the runner's logger (the
    FnApiRunner hands its workers no pipeline options, so --sdk_harness_log_level_overrides cannot
    reach them); real worker warnings still show."""
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    gcp.quiet_logging()
    logging.getLogger("apache_beam.runners.portability.local_job_service").addFilter(
        lambda record: "No semi_persistent_directory found" not in record.getMessage()
    )
