"""The example model: a small residual CNN for image classification.

Replace `build_model` to bring your own model; the rest of the project only needs a Keras model
that takes uint8 images [batch, size, size, 3] and returns float32 logits [batch, classes].

TPU notes: convolutions and dense layers run on the MXU, which multiplies 128x128 tiles, so
channel widths that are multiples of 128 avoid padding (configs/tpu.yaml). Under mixed_bfloat16
the layers compute in bfloat16 with float32 variables; the logits are float32 for a stable loss.
"""

from __future__ import annotations

from . import schedule
from .config import ModelConfig, TrainConfig
from .keras import keras

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


def build_model(config: ModelConfig, image_size: int, num_classes: int) -> keras.Model:
    images = keras.Input(shape=(image_size, image_size, 3), dtype="uint8", name="image")
    # Scaling on the device keeps the host-to-device transfer in uint8: 4x less than float32.
    x = layers.Rescaling(1.0 / 127.5, offset=-1.0, name="rescale")(images)
    x = layers.Conv2D(config.widths[0], 3, padding="same", use_bias=False, name="stem_conv")(x)
    x = _batch_norm(config, "stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    for stage, width in enumerate(config.widths):
        for block in range(config.blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _residual_block(x, width, stride, config, f"stage{stage}_block{block}")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(images, logits, name="resnet")


def set_precision(mixed_precision: str) -> None:
    """`bfloat16`: layers compute in bfloat16 and keep float32 variables (no loss scaling needed,
    unlike float16); `float32`: everything in float32."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if mixed_precision == "bfloat16" else "float32")


def compile_model(model: keras.Model, train: TrainConfig, steps_per_execution: int) -> keras.Model:
    """Attaches the optimizer (SGD with the scaled, warmed-up schedule), loss and metrics.

    The metrics are weighted so that evaluation, which pads the last steps with weight-0
    examples to keep shapes static, counts every real example exactly once.
    """
    optimizer = keras.optimizers.SGD(
        learning_rate=schedule.from_config(train), momentum=train.momentum, nesterov=True,
        weight_decay=train.weight_decay)
    optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])  # norms and biases
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                          keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent")],
        steps_per_execution=steps_per_execution)
    return model
