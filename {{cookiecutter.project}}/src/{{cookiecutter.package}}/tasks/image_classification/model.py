"""The example model: a small residual CNN for image classification.

Replace `build_model` to bring your own model; the rest of the project only needs a Keras model
that takes uint8 images [batch, size, size, 3] (input name "image") and returns float32 logits
[batch, classes].

TPU notes: convolutions and dense layers run on the MXU, which multiplies 128x128 tiles, so
channel widths that are multiples of 128 avoid padding (configs/tpu.yaml). Under mixed_bfloat16
the layers compute in bfloat16 with float32 variables; the logits are float32 for a stable loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core import recompute
from ...core.keras import keras
from .stem import stem_stride

if TYPE_CHECKING:
    from .task import ImageModelConfig as ModelConfig

layers = keras.layers


def _batch_norm(config: ModelConfig, name: str):
    # Per-replica statistics are the default; with small per-replica batches they are noisy and
    # cost accuracy, which synchronised batch norm fixes at the price of an all-reduce per layer.
    return layers.BatchNormalization(momentum=0.9, synchronized=config.sync_batch_norm, name=name)


def _residual_block(x, width: int, stride: int, config: ModelConfig, name: str):
    shortcut = x
    y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1")(x)
    y = _batch_norm(config, f"{name}_bn1")(y)
    y = layers.ReLU(name=f"{name}_relu1")(y)
    y = layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = _batch_norm(config, f"{name}_bn2")(y)
    if stride != 1 or shortcut.shape[-1] != width:
        shortcut = layers.Conv2D(width, 1, strides=stride, use_bias=False, name=f"{name}_proj")(shortcut)
        shortcut = _batch_norm(config, f"{name}_proj_bn")(shortcut)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([y, shortcut]))


def _stage(x, width: int, stage: int, config: ModelConfig):
    """The residual blocks of one stage; with `model.remat`, one recomputed unit that keeps only
    its input for the backward pass (its batch norms update their statistics once per step)."""

    def blocks(y):
        for block in range(config.blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            y = _residual_block(y, width, stride, config, f"stage{stage}_block{block}")
        return y

    if not config.remat:
        return blocks(x)
    stage_in = keras.Input(shape=x.shape[1:], dtype=x.dtype, name=f"stage{stage}_input")
    unit = keras.Model(stage_in, blocks(stage_in), name=f"stage{stage}")
    return recompute.Recomputed(unit, name=f"stage{stage}_recomputed")(x)


def build_model(config: ModelConfig, image_size: int, num_classes: int) -> keras.Model:
    images = keras.Input(shape=(image_size, image_size, 3), dtype="uint8", name="image")
    # Scaling on the device keeps the host-to-device transfer in uint8: 4x less than float32.
    x = layers.Rescaling(1.0 / 127.5, offset=-1.0, name="rescale")(images)
    # A kernel at least as wide as the stride, so that no pixel is skipped (a 4x4 kernel at
    # stride 4 is ConvNeXt's "patchify" stem).
    stride = stem_stride(config, image_size)
    x = layers.Conv2D(
        config.widths[0],
        max(3, stride),
        strides=stride,
        padding="same",
        use_bias=False,
        name="stem_conv",
    )(x)
    x = _batch_norm(config, "stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    for stage, width in enumerate(config.widths):
        x = _stage(x, width, stage, config)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(images, logits, name="resnet")
