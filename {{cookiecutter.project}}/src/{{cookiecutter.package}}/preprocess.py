"""Offline preprocessing in Apache Beam: an image folder -> sharded TFRecords + manifest.json.

    python -m {{ cookiecutter.package }}.preprocess --input data/raw --output data/tfrecords
    python -m {{ cookiecutter.package }}.preprocess --input gs://BUCKET/raw --output gs://BUCKET/tfrecords \\
        --runner DataflowRunner --project P --region R --temp_location gs://BUCKET/tmp ...

Input: RAW/<label>/<name>.(png|jpg|jpeg). Labels are the sorted folder names. Each image is
decoded, converted to RGB, resized to `data.image_size` and written as raw pixels (features.py).
A file with an image extension that does not decode (empty, truncated, not an image, corrupt) is
rejected with its path and reason into rejected.jsonl and counted by reason in the manifest and in
the Beam metrics; other files are ignored (and counted). A bad file never fails the job.

Guarantees:
- Deterministic: the split and the shard of an example come from a stable hash of its relative
  path, and each shard is written in sorted path order, so two runs give identical files.
- Exact: the manifest's counts are the records actually written to each split's shards.
- Never partial: shards are written to a temporary folder; only when all are final does one last
  step replace the previous output and write manifest.json, last.

The per-image work runs on batches of files (one Beam element per batch) and each batch is
grouped by shard before the single shuffle that sharded writing needs: per-element overhead is
what makes a naive Beam job slow on small images (`make bench-preprocess` measures it).

Without --runner the job runs in-process on the FnApiRunner. `--dry_run=True` with the
DataflowRunner builds the Dataflow job (and stages nothing), prints its options and steps, and
submits nothing: `make preprocess RUNNER=dataflow DRY_RUN=1`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import math
import re
import struct
import sys
import time
import uuid
from collections import defaultdict
from typing import Iterable, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from . import config as config_lib
from . import features, topology
from .errors import UserError, run_cli

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
SPLITS = ("train", "eval")
MANIFEST = "manifest.json"
REJECTED = "rejected.jsonl"
FILES_PER_ELEMENT = 128
TARGET_SHARD_BYTES = 128 * 2**20  # 100-200 MB shards read efficiently from GCS
MIN_SHARD_BYTES = 10 * 2**20  # below this, per-file overhead dominates
SHARDS_PER_HOST = 10  # enough files for every host to interleave several at once
RECORD_OVERHEAD_BYTES = 64  # Example proto and TFRecord framing around the pixels
NAMESPACE = "preprocess"
# Why a file was rejected: the code counted in the metrics and the manifest, and its meaning.
REJECT_REASONS = {
    "empty": "empty file",
    "truncated": "truncated: the file ends before the image data does",
    "not_an_image": "not an image: no known image format (wrong extension or another kind of file)",
    "corrupt": "corrupt image data",
}


# ----------------------------------------------------------------------------- stable hashing

def _hash_unit(relative_path: str, salt: bytes) -> float:
    digest = hashlib.sha256(salt + relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(relative_path: str, eval_fraction: float) -> str:
    """'eval' for a stable `eval_fraction` share of paths, else 'train'."""
    return "eval" if _hash_unit(relative_path, b"split:") < eval_fraction else "train"


def shard_of(relative_path: str, num_shards: int) -> int:
    return int(_hash_unit(relative_path, b"shard:") * num_shards)


def choose_num_shards(num_examples: int, bytes_per_example: int, reading_hosts: int) -> int:
    """Shards of ~128 MB, and at least 10 per reading host when the data is big enough that
    those shards still hold 10 MB or more."""
    total_bytes = num_examples * bytes_per_example
    by_size = math.ceil(total_bytes / TARGET_SHARD_BYTES)
    by_hosts = min(SHARDS_PER_HOST * reading_hosts, total_bytes // MIN_SHARD_BYTES)
    return max(1, by_size, by_hosts)


# ----------------------------------------------------------------------------- listing

def join(root: str, *parts: str) -> str:
    return FileSystems.join(root.rstrip("/"), *parts)


def list_images(input_root: str) -> tuple[list[str], list[str], int]:
    """(sorted relative paths of image files, sorted label names, number of ignored files)."""
    root = input_root.rstrip("/")
    try:
        matched = FileSystems.match([join(root, "**")])[0].metadata_list
    except Exception as error:  # Beam raises a generic error for a missing local folder
        raise UserError(f"cannot list {root}: {error}; check --input (RAW=...)") from None
    images, ignored = [], 0
    for metadata in matched:
        relative = metadata.path[len(root) + 1:]
        if relative.lower().endswith(IMAGE_EXTENSIONS) and relative.count("/") == 1:
            images.append(relative)
        else:
            ignored += 1
    if not images:
        raise UserError(f"no images found under {root}/<label>/*.(png|jpg|jpeg); "
                        f"run `make data` for the sample set or point RAW at an image folder")
    labels = sorted({path.split("/", 1)[0] for path in images})
    return sorted(images), labels, ignored


# ----------------------------------------------------------------------------- per-image work

class EmptyFileError(ValueError):
    pass


def load_image(data: bytes, image_size: int) -> np.ndarray:
    """Decodes any PIL-readable image to uint8 RGB [image_size, image_size, 3]; raises on a file
    that is empty, truncated or not a decodable image."""
    from PIL import Image, ImageFile

    if not data:
        raise EmptyFileError("empty file")
    # With this True, PIL fills the missing part of a truncated image with grey instead of raising:
    # a half-written upload would become a training example. It is False by default; another
    # library in the same worker process may have set it, so it is forced here.
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # decodes every pixel now: raises OSError on truncated data
        if image.mode in ("P", "LA") or (image.mode == "RGBA"):
            image = image.convert("RGBA")
            # Transparent pixels become black, as on a TPU there is no alpha channel to carry.
            background = Image.new("RGBA", image.size, (0, 0, 0, 255))
            image = Image.alpha_composite(background, image)
        image = image.convert("RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
        return np.asarray(image, dtype=np.uint8)


def reject_reason(error: Exception) -> str:
    """The REJECT_REASONS code for an error of `load_image`."""
    from PIL import UnidentifiedImageError

    if isinstance(error, EmptyFileError):
        return "empty"
    if isinstance(error, UnidentifiedImageError):
        return "not_an_image"
    # PIL: "image file is truncated (N bytes not processed)", "Truncated File Read".
    if "truncated" in str(error).lower():
        return "truncated"
    return "corrupt"


def reject_detail(reason: str, error: Exception) -> str:
    """REJECT_REASONS[reason] and the decoder's message, without object addresses, so that
    rejected.jsonl is as deterministic as the shards."""
    if reason == "empty":
        return REJECT_REASONS[reason]
    message = re.sub(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>", "", str(error))
    return f"{REJECT_REASONS[reason]} ({type(error).__name__}: {message})"


class EncodeFiles(beam.DoFn):
    """Reads, decodes and encodes a batch of files; emits ((split, shard), [(path, record)])."""

    def __init__(self, input_root: str, image_size: int, labels: Sequence[str], eval_fraction: float,
                 num_shards: dict):
        self.input_root = input_root.rstrip("/")
        self.image_size = image_size
        self.label_index = {name: index for index, name in enumerate(labels)}
        self.eval_fraction = eval_fraction
        self.num_shards = num_shards
        self.read = Metrics.counter(NAMESPACE, "read")
        self.encoded = Metrics.counter(NAMESPACE, "encoded")

    def process(self, relative_paths: Sequence[str]):
        by_shard = defaultdict(list)
        for relative in relative_paths:
            path = join(self.input_root, relative)
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
                data = handle.read()
            self.read.inc()
            try:
                pixels = load_image(data, self.image_size)
            except Exception as error:  # a bad file must never fail the job
                reason = reject_reason(error)
                Metrics.counter(NAMESPACE, f"rejected_{reason}").inc()
                yield beam.pvalue.TaggedOutput("rejected", {
                    "source": path, "reason": reason, "detail": reject_detail(reason, error)})
                continue
            record = features.encode(pixels, self.label_index[relative.split("/", 1)[0]])
            split = split_of(relative, self.eval_fraction)
            by_shard[(split, shard_of(relative, self.num_shards[split]))].append((relative, record))
            self.encoded.inc()
        yield from by_shard.items()


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
            handle.write(length + struct.pack("<I", _masked_crc32c(length)) + record
                         + struct.pack("<I", _masked_crc32c(record)))
            count += 1
            size += len(record)
    return count, size


def shard_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


class WriteShard(beam.DoFn):
    """Writes one shard, in sorted path order, into the temporary folder."""

    def __init__(self, temp_dir: str, compression: str):
        self.temp_dir = temp_dir
        self.compression = compression
        self.written = Metrics.counter(NAMESPACE, "written")

    def process(self, element):
        (split, shard), groups = element
        pairs = sorted(pair for group in groups for pair in group)
        path = join(self.temp_dir, f"{split}-shard-{shard:05d}{shard_suffix(self.compression)}")
        count, size = write_tfrecords(path, (record for _, record in pairs), self.compression)
        self.written.inc(count)
        yield {"split": split, "shard": shard, "path": path, "num_examples": count, "bytes": size}


def finalize(_, shards: list, rejected: list, output: str, temp_dir: str, labels: Sequence[str],
             image_size: int, eval_fraction: float, compression: str, ignored: int, input_root: str) -> dict:
    """Replaces the previous output with the new shards, then writes the manifest last."""
    output = output.rstrip("/")
    old_manifest = join(output, MANIFEST)
    if FileSystems.exists(old_manifest):
        FileSystems.delete([old_manifest])  # from here on no manifest describes a mixed folder
    old = [m.path for pattern in ("*-?????-of-?????.tfrecord", "*-?????-of-?????.tfrecord.gz", REJECTED)
           for m in FileSystems.match([join(output, pattern)])[0].metadata_list]
    if old:
        FileSystems.delete(old)

    splits = {}
    sources, destinations = [], []
    for split in SPLITS:
        written = sorted((s for s in shards if s["split"] == split), key=lambda s: s["shard"])
        names = [f"{split}-{index:05d}-of-{len(written):05d}{shard_suffix(compression)}"
                 for index in range(len(written))]
        sources += [s["path"] for s in written]
        destinations += [join(output, name) for name in names]
        splits[split] = {
            "num_examples": sum(s["num_examples"] for s in written),
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

    manifest = {
        "source": input_root,
        "splits": splits,
        "feature_spec": features.feature_spec(image_size),
        "image_size": image_size,
        "label_names": list(labels),
        "num_classes": len(labels),
        "eval_fraction": eval_fraction,
        "compression": compression,
        "rejected": {"count": len(rejected), "by_reason": dict(sorted(by_reason.items())), "file": REJECTED},
        "ignored_files": ignored,
    }
    with FileSystems.create(join(output, MANIFEST), mime_type="application/json") as handle:
        handle.write(json.dumps(manifest, indent=2).encode("utf-8"))
    remove_temp_folders(output, temp_dir)
    return manifest


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

def build_pipeline(pipeline: beam.Pipeline, input_root: str, output: str, image_size: int, eval_fraction: float,
                   reading_hosts: int = 1, num_shards: int | None = None, compression: str = "none") -> dict:
    """Adds the preprocessing steps to `pipeline`; returns what the driver learned from listing."""
    paths, labels, ignored = list_images(input_root)
    counts = {split: 0 for split in SPLITS}
    for path in paths:
        counts[split_of(path, eval_fraction)] += 1
    bytes_per_example = image_size * image_size * features.CHANNELS + RECORD_OVERHEAD_BYTES
    shards = {split: num_shards or choose_num_shards(counts[split], bytes_per_example, reading_hosts)
              for split in SPLITS}
    temp_dir = join(output, f".tmp-{uuid.uuid4().hex[:12]}")
    batches = [paths[i:i + FILES_PER_ELEMENT] for i in range(0, len(paths), FILES_PER_ELEMENT)]

    encoded = (pipeline
               | "ListedFiles" >> beam.Create(batches)
               | "DecodeResizeEncode" >> beam.ParDo(
                   EncodeFiles(input_root, image_size, labels, eval_fraction, shards)).with_outputs(
                       "rejected", main="records"))
    written = (encoded.records
               | "GroupByShard" >> beam.GroupByKey()
               | "WriteShards" >> beam.ParDo(WriteShard(temp_dir, compression)))
    _ = (pipeline
         | "Once" >> beam.Create([None])
         | "ReplaceOutputWriteManifest" >> beam.Map(
             finalize, shards=beam.pvalue.AsList(written), rejected=beam.pvalue.AsList(encoded.rejected),
             output=output, temp_dir=temp_dir, labels=labels, image_size=image_size,
             eval_fraction=eval_fraction, compression=compression, ignored=ignored, input_root=input_root))
    return {"files": len(paths), "labels": labels, "ignored": ignored, "expected": counts, "num_shards": shards}


def print_metrics(result) -> dict:
    counters = {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]
                if c.key.metric.namespace == NAMESPACE}
    rejected = {k[len("rejected_"):]: v for k, v in counters.items() if k.startswith("rejected_")}
    print(f"read {counters.get('read', 0)}, written {counters.get('written', 0)}, "
          f"rejected {sum(rejected.values())} {rejected or ''}".rstrip())
    return counters


def print_dry_run(pipeline: beam.Pipeline, options: PipelineOptions, result) -> None:
    """What `--dry_run=True` would have submitted: the options, the job and its steps."""
    from apache_beam.portability.api import beam_runner_api_pb2

    print(f"dry run: the job was built{' and validated' if result is not None else ''}; nothing was "
          f"submitted or run. Pipeline options:")
    for name, value in sorted(options.get_all_options(drop_default=True).items()):
        print(f"  --{name}={value}")
    steps = [part.full_label for part in pipeline.transforms_stack[0].parts]
    print(f"steps: {' -> '.join(steps)}")
    job = getattr(result, "job", None)
    if job is not None:  # DataflowRunner: the apiclient.Job and the portable pipeline it carries
        print(f"job: {job.proto.name}, {len(str(job))} bytes of job JSON before submission")
    proto = getattr(pipeline.runner, "proto_pipeline", None) if result is not None else None
    if proto is not None:
        print(f"pipeline proto: {len(proto.components.transforms)} transforms, "
              f"{len(proto.SerializeToString())} bytes")
        for environment in proto.components.environments.values():
            if environment.urn == "beam:env:docker:v1":
                image = beam_runner_api_pb2.DockerPayload.FromString(environment.payload).container_image
                print(f"worker image: {image}")
            staged = [beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(a.role_payload).staged_name
                      for a in environment.dependencies if a.role_payload]
            if staged:
                print(f"staged for the workers: {', '.join(staged)}")


def check_dataflow_paths(options: PipelineOptions, *paths: str) -> None:
    """Dataflow workers cannot see this machine's disk: refuse local paths before staging anything."""
    runner = options.view_as(StandardOptions).runner or ""
    if "dataflow" in runner.lower():
        local = [path for path in paths if not path.startswith("gs://")]
        if local:
            raise UserError(f"with the DataflowRunner, --input and --output must be gs:// paths, got "
                            f"{', '.join(local)}; upload the images (gcloud storage cp -r) and set "
                            f"RAW=gs://... DATA_DIR=gs://...")


def parse_args(argv: Sequence[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Other arguments are passed to Beam as pipeline options.")
    parser.add_argument("--input", required=True, help="image folder RAW/<label>/<image> (local or gs://)")
    parser.add_argument("--output", required=True, help="folder for shards and manifest.json (local or gs://)")
    parser.add_argument("--config", help="config file whose data.image_size and data.eval_fraction to use")
    parser.add_argument("--image_size", type=int, help="override data.image_size")
    parser.add_argument("--eval_fraction", type=float, help="override data.eval_fraction")
    parser.add_argument("--num_shards", type=int, help="shards per split (default: from the data size)")
    parser.add_argument("--reading_hosts", type=int, default=topology.topology().hosts,
                        help="hosts that will read the data in parallel (default: from the TPU type)")
    parser.add_argument("--compression", choices=("none", "gzip"), default="none")
    return parser.parse_known_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args, beam_args = parse_args(argv)
    data = config_lib.load(args.config).data
    image_size = args.image_size or data.image_size
    eval_fraction = args.eval_fraction if args.eval_fraction is not None else data.eval_fraction
    if args.num_shards is not None and args.num_shards < 1:
        raise UserError(f"--num_shards must be at least 1, got {args.num_shards}")
    if not any(arg == "--runner" or arg.startswith("--runner=") for arg in beam_args):
        # Beam's default, the DirectRunner, may hand the job to the Prism runner, which downloads
        # a binary from GitHub on first use: that fails offline and on locked-down TPU VMs. The
        # FnApiRunner runs in this process with nothing to download.
        beam_args = [*beam_args, "--runner=FnApiRunner"]
    options = PipelineOptions(beam_args)
    check_dataflow_paths(options, args.input, args.output)
    # Beam parses --dry_run as a string: "False" must not count.
    dry_run = str(options.get_all_options().get("dry_run")).lower() in ("true", "1", "yes")
    on_dataflow = "dataflow" in (options.view_as(StandardOptions).runner or "").lower()

    started = time.perf_counter()
    pipeline = beam.Pipeline(options=options)
    plan = build_pipeline(pipeline, args.input, args.output, image_size, eval_fraction,
                          args.reading_hosts, args.num_shards, args.compression)
    print(f"{plan['files']} image files in {len(plan['labels'])} classes ({plan['ignored']} other files ignored); "
          f"by path hash: train {plan['expected']['train']}, eval {plan['expected']['eval']}; "
          f"shards {plan['num_shards']}; image size {image_size}", flush=True)
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
    with FileSystems.open(join(args.output, MANIFEST)) as handle:
        manifest = json.load(handle)
    total = sum(split["num_examples"] for split in manifest["splits"].values())
    per_split = ", ".join(f"{name} {split['num_examples']}" for name, split in manifest["splits"].items())
    print(f"wrote {total} examples ({per_split}) "
          f"to {args.output} in {elapsed:.1f}s ({counters.get('read', 0) / elapsed:.0f} files/s); "
          f"rejected {manifest['rejected']['count']} {manifest['rejected']['by_reason'] or ''} "
          f"(listed in {REJECTED}); ignored {manifest['ignored_files']} non-image files")
    return 0


if __name__ == "__main__":
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    run_cli(main, sys.argv[1:])
