"""The stride of the stem (`model.stem_stride: auto`) and the size of the first stage it leaves.

The first stage's resolution sets most of the network's cost: every later stage halves it, so the
first stage's pixels are most of the compute and of the activations kept for the backward pass.
`auto` aims the first stage at about 32 px, the resolution this ResNet is sized for (the 32 px
sample, CIFAR-style ResNets), with the stride a power of two up to 4: 1 at 32 px, 2 around 64 px,
4 from 128 px. ImageNet ResNets reduce 4x the same way before their first stage (224 -> 56 px);
beyond 4 a patch stem starts to drop detail that small images need, so larger images keep 4 and
the first stage grows (a deeper `model.widths` is the better answer there).
"""

from __future__ import annotations

TARGET_FIRST_STAGE = 32
MAX_AUTO_STRIDE = 4
LARGE_FIRST_STAGE = 64  # a first stage above this side is 4x (or more) the pixels `auto` aims at


def stride_for(image_size: int) -> int:
    """The largest power of two <= image_size / TARGET_FIRST_STAGE, between 1 and MAX_AUTO_STRIDE."""
    stride = 1
    while stride * 2 <= min(MAX_AUTO_STRIDE, image_size // TARGET_FIRST_STAGE):
        stride *= 2
    return stride


def stem_stride(model_config, image_size: int) -> int:
    """`model.stem_stride`: an explicit number as given, `auto` from the image size."""
    return stride_for(image_size) if model_config.stem_stride == "auto" else int(model_config.stem_stride)


def first_stage_side(model_config, image_size: int) -> int:
    stride = stem_stride(model_config, image_size)
    return -(-image_size // stride)  # "same" padding rounds up


def describe(model_config, image_size: int) -> str:
    stride, side = stem_stride(model_config, image_size), first_stage_side(model_config, image_size)
    why = f"auto for {image_size} px images" if model_config.stem_stride == "auto" else "as configured"
    return f"stem stride {stride} ({why}): first stage at {side}x{side} px"


def first_stage_activations(cfg, target, manifest):
    """`make doctor`: the first stage's activations per replica. A large first stage makes every
    step slow (most of the compute is there) and, on a TPU, fills HBM with the activations the
    backward pass keeps."""
    image_size = (manifest or {}).get("image_size") or cfg.data.image_size
    side = first_stage_side(cfg.model, image_size)
    replicas = max(1, getattr(target, "replicas", 1) or 1)
    per_replica = max(1, cfg.train.global_batch_size // replicas)
    bytes_per_value = 4 if cfg.runtime.mixed_precision == "float32" else 2
    mib = per_replica * side * side * cfg.model.widths[0] * bytes_per_value / 2**20
    message = (
        f"{describe(cfg.model, image_size)}, {mib:.0f} MiB per activation tensor per replica "
        f"(batch {per_replica}, {cfg.model.widths[0]} channels)"
    )
    if side > LARGE_FIRST_STAGE:
        suggested = stride_for(image_size)
        fix = (
            f"set model.stem_stride=auto (stride {suggested} here)"
            if suggested > stem_stride(cfg.model, image_size)
            else "use smaller images (data.image_size) or a narrower first stage (model.widths)"
        )
        return "warn", f"{message}: the first stage is large for a {side} px side", fix
    return "pass", message, ""


def rules() -> list:
    return [("model.first_stage_activations", first_stage_activations)]
