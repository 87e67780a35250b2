"""`make doctor` rules: the input pipeline and where data and runs live.

From the Cloud TPU guide's "Static shapes", "Input pipeline performance" and "Storage".
"""

from __future__ import annotations

import logging
import math

from ..core.topology import IDEAL_SHARD_BYTES, MIN_SHARD_BYTES, SHARDS_PER_HOST
from .engine import (
    Context,
    Verdict,
    _mb,
    fail,
    passed,
    rule,
    skip,
    warn,
    worst,
)


@rule("input.static_shapes")
def input_static_shapes(ctx: Context) -> Verdict:
    manifest = ctx.manifest
    if manifest is None:
        return skip("no usable manifest (see data.manifest)")
    if ctx.per_replica_batch is None:
        return skip("the global batch does not divide (see batch.divisible)")
    import tensorflow as tf

    from ..core import input_pipeline

    cfg, target = ctx.cfg, ctx.target
    pipelines = target.hosts
    shapes, dynamic = [], []
    quiet = logging.getLogger(input_pipeline.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the record-level fallback warning is data.shard_count's business
    try:
        compression = manifest.get("compression", "none")
        for split in ("train", "eval"):
            files, examples_per_file = input_pipeline.split_files(cfg.data.dir, manifest, split)
            if split == "train":
                dataset = input_pipeline.train_pipeline(
                    files,
                    examples_per_file,
                    ctx.task,
                    manifest,
                    ctx.per_replica_batch,
                    seed=cfg.runtime.seed,
                    shuffle_buffer=cfg.data.shuffle_buffer,
                    num_pipelines=pipelines,
                    compression=compression,
                    data_config=cfg.data,
                )
            else:
                dataset = input_pipeline.eval_pipeline(
                    files,
                    examples_per_file,
                    ctx.task,
                    manifest,
                    ctx.per_replica_batch,
                    num_pipelines=pipelines,
                    replicas_per_pipeline=max(1, target.replicas // pipelines),
                    global_batch_size=cfg.train.global_batch_size,
                    compression=compression,
                    data_config=cfg.data,
                )
            specs = tf.nest.flatten(dataset.element_spec)
            shapes.append(f"{split} " + " ".join(str(spec.shape.as_list()) for spec in specs))
            dynamic += [f"{split} {spec.shape}" for spec in specs if not spec.shape.is_fully_defined()]
    finally:
        quiet.setLevel(level)
    if dynamic:
        return fail(
            f"input shapes not fully defined: {', '.join(dynamic)}; a TPU compiles one program per shape",
            "batch with drop_remainder=True and give every tensor a static shape (input_pipeline.py)",
        )
    return passed(f"static shapes: {'; '.join(shapes)}")


# The host must deliver examples this much faster than the chips consume them: decoding shares
# the host's cores with everything else, and a margin absorbs slow files and GC pauses.
HOST_INPUT_MARGIN = 1.25
HOST_INPUT_SECONDS = 2.0


@rule("input.host_capacity")
def input_host_capacity(ctx: Context) -> Verdict:
    """The training input of one host, run for a couple of seconds on this machine's CPUs, against
    the examples per second per host that the last run's chips consumed."""
    manifest, needed_total = ctx.manifest, ctx.history.examples_per_second
    if manifest is None:
        return skip("no usable manifest (see data.manifest)")
    if not needed_total:
        return skip(
            f"no finished run in {ctx.cfg.runtime.output_dir} says how fast the chips consume examples "
            "(train once, or compare with `make bench`)"
        )
    if ctx.per_replica_batch is None:
        return skip("the global batch does not divide (see batch.divisible)")
    import time

    from ..core import input_pipeline

    cfg, target = ctx.cfg, ctx.target
    files, examples_per_file = input_pipeline.split_files(cfg.data.dir, manifest, "train")
    dataset = input_pipeline.train_pipeline(
        files,
        examples_per_file,
        ctx.task,
        manifest,
        ctx.per_replica_batch,
        seed=cfg.runtime.seed,
        shuffle_buffer=cfg.data.shuffle_buffer,
        num_pipelines=target.hosts,
        compression=manifest.get("compression", "none"),
        data_config=cfg.data,
    )
    iterator = iter(dataset)
    next(iterator)  # threads started, first files open
    batches, started = 0, time.perf_counter()
    while time.perf_counter() - started < HOST_INPUT_SECONDS:
        next(iterator)
        batches += 1
    delivered = batches * ctx.per_replica_batch / (time.perf_counter() - started)
    needed = needed_total / target.hosts
    found = (
        f"this host decodes {delivered:,.0f} examples/s; the last run consumed {needed:,.0f} per host "
        f"({needed_total:,.0f} in all)"
    )
    if delivered < HOST_INPUT_MARGIN * needed:
        return warn(
            f"{found}: training would be input-bound",
            "write more shards (preprocess --num_shards), store raw pixels instead of JPEG at small sizes, "
            "turn data.augment off, or use a VM with more host cores; `make bench` measures each",
        )
    return passed(f"{found} ({delivered / needed:.1f}x)")


@rule("data.credentials")
def data_credentials(ctx: Context) -> Verdict:
    paths = {"data.dir": ctx.cfg.data.dir, "runtime.output_dir": ctx.cfg.runtime.output_dir}
    remote = [f"{name}={path}" for name, path in paths.items() if path.startswith("gs://")]
    if not remote:
        return passed("no gs:// path among data.dir and runtime.output_dir: no credentials needed")
    if not ctx.no_credentials:
        return passed(f"{', '.join(remote)}: read with {ctx.credentials or 'the credentials found'}")
    from ..core import gcp

    found = ctx.no_credentials.removesuffix(gcp.FIX).rstrip(":; ")
    return warn(
        f"{found}: the rules that read them (data.manifest, the input and shard rules, the last run's) are skipped; "
        "the plan, the batch rules and the support matrix need none",
        gcp.FIX,
    )


@rule("data.manifest")
def data_manifest(ctx: Context) -> Verdict:
    manifest, error, fix = ctx.manifest_or_error
    if manifest is None and ctx.unreadable(ctx.cfg.data.dir):
        return skip(error)
    if manifest is None:
        return fail(error, fix)
    splits = manifest["splits"]
    return passed(
        f"{ctx.cfg.data.dir}: {splits['train']['num_examples']} train / {splits['eval']['num_examples']} "
        f"eval examples, {ctx.task.describe_data(manifest)}, feature spec "
        f"v{manifest['feature_spec']['version']}"
    )


def _split_sizes(manifest: dict, split: str) -> tuple[int, int]:
    """(shard files, bytes) of a split."""
    info = manifest["splits"][split]
    return len(info["files"]), int(info.get("bytes", 0))


TOO_SMALL_FIX = (
    "nothing at this size (harmless for sample data); for real data let `make preprocess` choose: "
    "~128 MB shards, 10+ per reading host"
)


def _too_small_for_both(total_bytes: int, hosts: int) -> bool:
    return total_bytes < SHARDS_PER_HOST * hosts * MIN_SHARD_BYTES


@rule("data.shard_count")
def data_shard_count(ctx: Context) -> Verdict:
    if ctx.manifest is None:
        return skip("no usable manifest (see data.manifest)")
    hosts = ctx.target.hosts
    want = SHARDS_PER_HOST * hosts
    train_files, train_bytes = _split_sizes(ctx.manifest, "train")
    eval_files, _ = _split_sizes(ctx.manifest, "eval")
    found = f"train {train_files} / eval {eval_files} shards for {hosts} reading host{'s' if hosts > 1 else ''}"
    verdicts = []
    if train_files < want:
        if _too_small_for_both(train_bytes, hosts):
            verdicts.append(
                warn(
                    f"{found}: under {SHARDS_PER_HOST} train shards per host, but the train split is "
                    f"only {_mb(train_bytes)}, too small for {want} shards of 10 MB+",
                    TOO_SMALL_FIX,
                )
            )
        else:
            verdicts.append(
                warn(
                    f"{found}: under {SHARDS_PER_HOST} train shards per host",
                    f"make preprocess PREPROCESS_ARGS='--num_shards {want}'",
                )
            )
    if eval_files < hosts:
        verdicts.append(
            warn(
                f"fewer eval shards than hosts: every host reads all eval files and keeps 1 record in {hosts}",
                f"at least {hosts} eval shards (preprocess --num_shards)",
            )
        )
    return worst(*verdicts) if verdicts else passed(f"{found} (>= {SHARDS_PER_HOST} per host)")


@rule("data.shard_size")
def data_shard_size(ctx: Context) -> Verdict:
    if ctx.manifest is None:
        return skip("no usable manifest (see data.manifest)")
    files, total = _split_sizes(ctx.manifest, "train")
    size = total / max(1, files)
    found = f"train shards average {_mb(size)} ({files} file{'s' if files > 1 else ''}, {_mb(total)} in all)"
    if size >= IDEAL_SHARD_BYTES:
        return passed(found)
    if size >= MIN_SHARD_BYTES:
        return passed(f"{found}; 100 MB+ is ideal")
    found = f"{found}: under 10 MB, per-file overhead dominates the reads"
    if _too_small_for_both(total, ctx.target.hosts):
        return warn(f"{found} (the split is too small for 10 shards of 10 MB per host)", TOO_SMALL_FIX)
    fewer = max(ctx.target.hosts * SHARDS_PER_HOST, math.ceil(total / IDEAL_SHARD_BYTES))
    return warn(found, f"fewer, larger shards: make preprocess PREPROCESS_ARGS='--num_shards {fewer}'")


@rule("data.location")
def data_location(ctx: Context) -> Verdict:
    data_dir, hosts = ctx.cfg.data.dir, ctx.target.hosts
    if data_dir.startswith("gs://"):
        return passed(f"{data_dir} is on Cloud Storage")
    if hosts > 1:
        return fail(
            f"data.dir={data_dir} is a local path but {ctx.target.tpu_type} has {hosts} hosts: the workers "
            "cannot read this machine's disk",
            "make preprocess DATA_DIR=gs://BUCKET/... and set data.dir to it",
        )
    return passed(f"{data_dir} is local, read by the one host")


@rule("run.location")
def run_location(ctx: Context) -> Verdict:
    output_dir, hosts = ctx.cfg.runtime.output_dir, ctx.target.hosts
    if output_dir.startswith("gs://") or hosts == 1:
        return passed(f"runtime.output_dir={output_dir}")
    return warn(
        f"runtime.output_dir={output_dir} is local on a {hosts}-host slice: checkpoints and logs written by "
        "the workers land on their own disks",
        "runtime.output_dir=gs://BUCKET/runs/...",
    )
