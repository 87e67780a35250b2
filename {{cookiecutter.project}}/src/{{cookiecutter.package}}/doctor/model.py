"""`make doctor` rules: the model ("Tensor dimensions", "Fully connected layers", "Batch normalization", "bfloat16")."""

from __future__ import annotations

from ..core import precision, warm_start
from ..core.errors import UserError
from . import memory
from .engine import (
    BATCH_FOR_SMALL_TILE,
    MIN_BN_BATCH,
    MIN_HIDDEN_DENSE,
    MXU_TILE,
    SMALL_TILE,
    Context,
    Verdict,
    _names,
    fail,
    not_on_a_tpu,
    passed,
    rule,
    skip,
    warn,
)


@rule("model.build")
def model_build(ctx: Context) -> Verdict:
    layers, description, error = ctx.model_or_error
    if error:
        return fail(f"build_model failed: {error}", "fix model.py or the model.* keys")
    if not ctx.feature_layers:
        return warn(
            f"{description}; no conv or hidden dense layers found to check",
            "the model rules only know Conv and Dense layers",
        )
    return passed(description)


def _feature_quantum(ctx: Context) -> int:
    return SMALL_TILE if ctx.cfg.train.global_batch_size % BATCH_FOR_SMALL_TILE == 0 else MXU_TILE


@rule("model.feature_dims")
def model_feature_dims(ctx: Context) -> Verdict:
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    if skipped := not_on_a_tpu(ctx, "MXU tiles apply", "checks the TPU model"):
        return skipped
    quantum = _feature_quantum(ctx)
    why = (
        f"the global batch is a multiple of {BATCH_FOR_SMALL_TILE}"
        if quantum == SMALL_TILE
        else f"the global batch is not a multiple of {BATCH_FOR_SMALL_TILE}"
    )
    odd = [layer for layer in ctx.feature_layers if layer.width % quantum]
    if not odd:
        best = MXU_TILE if all(layer.width % MXU_TILE == 0 for layer in ctx.feature_layers) else quantum
        return passed(
            f"{len(ctx.feature_layers)} conv/dense layers have widths that are multiples of {best}"
            + ("" if best == MXU_TILE else f" ({why})")
        )
    by_width: dict[int, list[str]] = {}
    for layer in odd:
        by_width.setdefault(layer.width, []).append(layer.name)
    listing = "; ".join(f"{width}: {_names(names)}" for width, names in sorted(by_width.items()))
    return warn(
        f"widths not a multiple of {quantum} ({why}), padded on the MXU: {listing}",
        ctx.task.width_fix(ctx.cfg.model, quantum),
    )


@rule("model.narrow_layers")
def model_narrow_layers(ctx: Context) -> Verdict:
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    if skipped := not_on_a_tpu(ctx, "MXU tiles apply", "checks the TPU model"):
        return skipped
    narrow = [layer for layer in ctx.feature_layers if layer.width < MXU_TILE]
    if not narrow:
        return passed(f"every conv/dense layer is at least {MXU_TILE} wide")
    return warn(
        f"{len(narrow)} layers narrower than {MXU_TILE} use a fraction of the {MXU_TILE}x{MXU_TILE} MXU: "
        f"{_names([f'{layer.name} ({layer.width})' for layer in narrow])}",
        f"{ctx.task.width_fix(ctx.cfg.model, MXU_TILE)} on a TPU",
    )


@rule("model.hidden_dense")
def model_hidden_dense(ctx: Context) -> Verdict:
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    hidden = [layer for layer in ctx.feature_layers if layer.kind == "dense"]
    if not hidden:
        return skip("no hidden Dense layers (the logits layer is exempt)")
    small = [layer for layer in hidden if layer.width < MIN_HIDDEN_DENSE]
    if not small:
        return passed(f"{len(hidden)} hidden Dense layers, all >= {MIN_HIDDEN_DENSE} units")
    return warn(
        f"hidden Dense layers under {MIN_HIDDEN_DENSE} units are too small to keep the MXU busy: "
        f"{_names([f'{layer.name} ({layer.width})' for layer in small])}",
        f"widen them to {MIN_HIDDEN_DENSE}+ units, or accept that they run below peak",
    )


@rule("model.batch_norm")
def model_batch_norm(ctx: Context) -> Verdict:
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    norms = [layer for layer in ctx.layers if layer.kind == "batch_norm"]
    if not norms:
        return skip("no batch normalization layers")
    per_replica = ctx.per_replica_batch
    if per_replica is None:
        return skip("the global batch does not divide (see batch.divisible)")
    unsynced = [layer for layer in norms if not layer.synchronized]
    if not unsynced:
        return passed(f"{len(norms)} batch-norm layers synchronised across replicas")
    if per_replica >= MIN_BN_BATCH:
        return passed(f"{per_replica} examples per replica for per-replica batch-norm statistics (>= {MIN_BN_BATCH})")
    suggestion = MIN_BN_BATCH * ctx.target.replicas
    return warn(
        f"{len(unsynced)} batch-norm layers compute statistics over {per_replica} examples per replica "
        f"(under {MIN_BN_BATCH}): noisy, costs accuracy",
        f"train.global_batch_size={suggestion} or model.sync_batch_norm=true",
    )


@rule("model.memory")
def model_memory(ctx: Context) -> Verdict:
    return memory.verdict(ctx)


@rule("model.flops")
def model_flops(ctx: Context) -> Verdict:
    return memory.flops_verdict(ctx)


@rule("model.init_from")
def model_init_from(ctx: Context) -> Verdict:
    train = ctx.cfg.train
    if not train.init_from:
        return skip("train.init_from is empty: a new run starts from random weights")
    if ctx.unreadable(train.init_from):
        return skip(f"{train.init_from}: not read, no Google Cloud credentials here (see data.credentials)")
    if ctx.layers is None or ctx.manifest is None:
        return skip("the model or the data's manifest could not be read (see model.build and data.manifest)")
    try:
        source = warm_start.Source.read(train.init_from)
        vocabulary = warm_start.check_vocabulary(source, ctx.manifest)
        found = warm_start.match(ctx.planner.model(precision_name=ctx.precision), source, train.init_skip)
    except UserError as error:  # its message says what is wrong; then, after "; ", the fix
        message, _, fix = str(error).partition("; ")
        return fail(message, fix or "check train.init_from")
    step = f" at step {source.step}" if source.step is not None else ""
    return passed(
        f"{source.checkpoint}{step}: {len(found.loaded)} weights to load, {len(found.new)} new, "
        f"{len(found.skipped)} skipped by train.init_skip" + (f"; {vocabulary}" if vocabulary else "")
    )


@rule("model.precision")
def model_precision(ctx: Context) -> Verdict:
    requested, kind = ctx.cfg.runtime.mixed_precision, ctx.target.kind
    if kind == "gpu" and requested == "auto":
        return passed("auto: bfloat16 on GPUs of compute capability 8.0+ (A100, L4, H100), float32 before them")
    choice = precision.choose(requested, kind)
    if kind == "tpu":
        if choice.precision == "bfloat16":
            return passed(f"{choice.describe()}: the MXU's native type, float32 variables")
        return warn(
            "float32 on a TPU: the MXU multiplies in bfloat16 passes anyway, activations take twice the "
            "memory and bandwidth",
            "runtime.mixed_precision=bfloat16",
        )
    native, why = precision.native(kind) if kind == "cpu" else (True, "")
    if requested == "bfloat16" and not native:
        return warn(
            f"bfloat16 is emulated here ({why}): training runs several times slower than in float32",
            "runtime.mixed_precision=auto (float32 here, bfloat16 on the TPU), or keep bfloat16 to run "
            "the TPU's numerics",
        )
    return passed(f"{choice.describe()}; the TPU configs keep bfloat16")
