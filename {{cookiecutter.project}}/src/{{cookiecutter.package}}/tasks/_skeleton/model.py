"""The model of __task__: a small multilayer perceptron on standardised features (the toy part:
replace `build_model` with your network).

The rest of the project needs a Keras model that takes what `parse_batch` returns as features and
returns float32 outputs of the shape `build_loss`'s loss expects. TPU notes: Dense layers run on the
MXU, which multiplies 128x128 tiles, so widths that are multiples of 128 avoid padding
(configs/tpu.yaml).
Under mixed_bfloat16 the layers compute in bfloat16 with float32 variables; the output layer here
computes in float32 for a stable loss.
"""

from __future__ import annotations

import numpy as np

from ...core import recompute
from ...core.keras import keras
from ...core.task import Manifest

layers = keras.layers


def _unit(x, layer, remat: bool):
    """`layer` applied to `x`; with `remat`, as one recomputed unit that keeps only its input for
    the backward pass (wrap whole blocks of a real network the same way)."""
    if not remat:
        return layer(x)
    unit_in = keras.Input(shape=x.shape[1:], dtype=x.dtype, name=f"{layer.name}_input")
    unit = keras.Model(unit_in, layer(unit_in), name=f"{layer.name}_unit")
    return recompute.Recomputed(unit, name=f"{layer.name}_recomputed")(x)


def build_model(hidden: list[int], manifest: Manifest, remat: bool = False) -> keras.Model:
    """features [batch, num_features] float32 -> prediction [batch, 1] float32. Standardises each
    feature and the target with the train split's statistics (from the manifest), so the raw
    numbers are what the model is served."""
    stats = manifest["statistics"]
    mean, std = np.array(stats["feature_mean"]), np.array(stats["feature_std"])
    features = keras.Input(shape=(manifest["num_features"],), dtype="float32", name="features")
    x = layers.Rescaling((1.0 / std).tolist(), offset=(-mean / std).tolist(), name="standardise")(features)
    for index, width in enumerate(hidden):
        x = _unit(x, layers.Dense(width, activation="relu", name=f"hidden{index}"), remat)
    standardised = layers.Dense(1, dtype="float32", name="output")(x)
    prediction = layers.Rescaling(stats["target_std"], offset=stats["target_mean"], dtype="float32", name="target")(
        standardised
    )
    return keras.Model(features, prediction, name="__task__")
