"""`make doctor` rules: batch size and tensor padding ("Batch size", "Tensor dimensions", "Padding")."""

from __future__ import annotations

import math

from .engine import PER_CORE_BATCH, SMALL_TILE, Context, Verdict, fail, passed, rule, skip, warn


def _batch_suggestions(batch: int, multiple: int) -> str:
    lower = batch // multiple * multiple
    return " or ".join(str(v) for v in (lower, lower + multiple) if v > 0)


@rule("batch.divisible")
def batch_divisible(ctx: Context) -> Verdict:
    batch, replicas = ctx.cfg.train.global_batch_size, ctx.target.replicas
    if ctx.per_replica_batch is None:
        return fail(
            f"train.global_batch_size={batch} does not divide across {replicas} replicas",
            f"train.global_batch_size={_batch_suggestions(batch, replicas)} (a multiple of {replicas})",
        )
    return passed(f"global batch {batch} = {ctx.per_replica_batch} per replica x {replicas}")


@rule("batch.multiple_of_8")
def batch_multiple_of_8(ctx: Context) -> Verdict:
    per_replica = ctx.per_replica_batch
    if per_replica is None:
        return skip("the global batch does not divide (see batch.divisible)")
    if per_replica % SMALL_TILE == 0:
        return passed(f"{per_replica} per replica is a multiple of {SMALL_TILE}")
    padded = math.ceil(per_replica / SMALL_TILE) * SMALL_TILE
    message = f"{per_replica} per replica is not a multiple of {SMALL_TILE}"
    if ctx.target.kind != "tpu":
        return passed(f"{message} (matters on a TPU only)")
    step = SMALL_TILE * ctx.target.replicas
    return warn(
        f"{message}: XLA pads it to {padded}, {100 * (padded - per_replica) / padded:.0f}% of every step "
        "computes padding",
        f"train.global_batch_size={_batch_suggestions(ctx.cfg.train.global_batch_size, step)}",
    )


@rule("batch.per_core_128")
def batch_per_core_128(ctx: Context) -> Verdict:
    if ctx.target.kind != "tpu":
        return skip(f"applies to a TPU target; this one is {ctx.target.kind.upper()}")
    per_replica = ctx.per_replica_batch
    if per_replica is None:
        return skip("the global batch does not divide (see batch.divisible)")
    if per_replica >= PER_CORE_BATCH:
        return passed(f"{per_replica} per core (>= {PER_CORE_BATCH})")
    return warn(
        f"{per_replica} per core is under the {PER_CORE_BATCH} the Cloud TPU guide recommends: the MXU idles",
        f"train.global_batch_size={PER_CORE_BATCH * ctx.target.replicas} if it fits in memory (the learning "
        "rate scales with it)",
    )
