"""Image classification: RAW/<label>/<image> (or a CSV index) -> uint8 [size, size, 3] -> residual CNN -> class.

    raw input       RAW/<label>/<name>.(png|jpg|jpeg), or RAW=index.csv of [ML_USE,]PATH,LABEL rows
    preprocessing   read_raw -> encode: shorter side resized, centre square, raw pixels or JPEG
    input           parse_batch: uint8 [batch, image_size, image_size, 3]; random-resized crop and
                    flip when training with data.augment, the centre crop otherwise
    model           model.py: a residual CNN
    serving         uint8 images -> probabilities and class; predict parses files like evaluation

The contract's members (../../core/task.py), grouped as its map groups them: by where the data is.
"""

from __future__ import annotations

import math
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal, Sequence, Union

import numpy as np

from ...core import config as config_lib
from ...core.errors import UserError
from ...core.task import Listing, Manifest, RawExample, RawRejection, Rejected, Testing, files_under
from ..classification import ClassificationTask
from . import csv_index, features, sample_data, stem
from .corpora import CORPORA

# Example proto and TFRecord framing around the pixels, for sizing shards.
RECORD_OVERHEAD_BYTES = 64
# Raw bytes over JPEG bytes at features.JPEG_QUALITY, only to choose the number of shards: ~10
# on the sample at 128 px, ~3 at 32 px (where the JPEG headers dominate). On the low side: an
# underestimate only makes shards smaller.
JPEG_COMPRESSION = 6


@dataclass(frozen=True)
class ImageDataConfig(config_lib.DataConfig):
    image_size: int = 32
    """Side in pixels of the images the model sees; preprocessing resizes the shorter side to it
    (plus a crop margin for JPEG) and keeps the centre square. Training checks the manifest agrees."""
    image_encoding: Literal["raw", "jpeg"] = "raw"
    """How shards store pixels. `raw`: uint8 pixels, no decoding on the host; best for small
    images (the 32 px sample: 3 KB each). `jpeg`: several times smaller, decoded and cropped on the
    host; pick it from ~64-128 px up, where raw pixels make shards and reads 7.5x larger (48 KB per
    example at 128 px) and a TPU host has cores to spare for decoding (`make bench` measures both).
    Preprocess and train with the same value."""
    augment: bool = False
    """Training only: a random-resized crop (area in [min_crop_area, 1], aspect 3/4 to 4/3) and a
    random horizontal flip of each example, on the host; evaluation and predict take the centre
    crop. Worth it on real photos; the small sample learns as well without it."""
    min_crop_area: float = 0.25
    """Smallest share of the image a random training crop keeps (ImageNet recipes: 0.08; larger
    when the objects are small or the images are)."""

    def problem(self) -> str | None:
        if self.image_size < 1:
            return f"data.image_size must be at least 1, got {self.image_size}"
        if not 0.0 < self.min_crop_area <= 1.0:
            return f"data.min_crop_area must be in (0, 1], got {self.min_crop_area}"
        return None


@dataclass(frozen=True)
class ImageModelConfig:
    widths: list[int] = field(default_factory=lambda: [32, 64, 128])
    """Channels of each residual stage; each stage after the first halves the resolution.
    On a TPU use multiples of 128: the MXU multiplies 128x128 tiles and pads anything else."""
    blocks_per_stage: int = 1
    """Residual blocks in each stage."""
    sync_batch_norm: bool = False
    """Compute batch-norm statistics across all replicas instead of per replica. Worth it when
    the per-replica batch is small (under ~32), at the cost of one all-reduce per layer."""
    stem_stride: Union[int, Literal["auto"]] = "auto"
    """Stride of the first convolution, which divides the compute of every later layer by its
    square. `auto` (see stem.py) takes it from data.image_size: 1 at 32 px, 2 around 64 px, 4 from
    128 px (ImageNet ResNets reduce 4x before the first stage); a number is used as given."""
    remat: bool = False
    """Recompute each residual stage's activations in the backward pass instead of keeping them:
    the activations kept shrink to the stages' inputs (`make doctor` shows by how much) for about a
    third more compute per step. A memory lever for models that do not fit; see core/recompute.py."""

    def problem(self) -> str | None:
        if not self.widths or min(self.widths) < 1:
            return f"model.widths must be a non-empty list of positive integers, got {self.widths}"
        if self.blocks_per_stage < 1:
            return f"model.blocks_per_stage must be at least 1, got {self.blocks_per_stage}"
        if self.stem_stride != "auto" and self.stem_stride < 1:
            return f"model.stem_stride must be at least 1, got {self.stem_stride}"
        return None


class ImageClassificationTask(ClassificationTask):
    name = "image_classification"
    data_config = ImageDataConfig
    model_config = ImageModelConfig
    raw_format = "RAW/<label>/<name>.(png|jpg|jpeg), or RAW=index.csv with [ML_USE,]PATH,LABEL rows"
    reject_reasons = {**features.REJECT_REASONS, **csv_index.REJECT_REASONS}

    # --------------------------------------------------------------- preprocessing
    def list_raw(self, input_root: str) -> Listing:
        from apache_beam.io.filesystems import FileSystems

        if csv_index.is_index(input_root):
            if not FileSystems.exists(input_root):
                raise UserError(
                    f"{input_root} not found; RAW must be an image folder or a CSV index of [ML_USE,]PATH,LABEL rows"
                )
            # The index is the one unit, as a full path (read_raw resolves relative rows against
            # its folder); the rows' paths, relative to that folder, are the example sources.
            location = input_root if csv_index.is_full_path(input_root) else os.path.abspath(input_root)
            return Listing([location], root=posixpath.dirname(input_root) or ".")
        root = input_root.rstrip("/")
        images, ignored = [], 0
        for relative in files_under(root):
            if relative.lower().endswith(features.IMAGE_EXTENSIONS) and relative.count("/") == 1:
                images.append(relative)
            else:
                ignored += 1
        if not images:
            raise UserError(
                f"no images found under {root}/<label>/*.(png|jpg|jpeg); "
                f"run `make data` for the sample set or point RAW at an image folder"
            )
        return Listing(sorted(images), ignored)

    def read_raw(self, relative: str, raw_bytes: bytes) -> Iterator[RawExample | RawRejection]:
        if csv_index.is_index(relative):
            yield from csv_index.read_rows(relative, raw_bytes)
        else:
            yield RawExample(relative, relative.split("/", 1)[0], raw_bytes)

    def encode(self, example: RawExample, data_config: ImageDataConfig, vocabularies, artifacts) -> tuple[bytes, dict]:
        content = example.payload
        if isinstance(content, str):  # a CSV row: where the image is, read here on the Beam worker
            content = csv_index.read_image(content)
            if content is None:
                raise Rejected("missing", f"{csv_index.REJECT_REASONS['missing']}: {example.payload}")
        try:
            pixels = features.load_image(
                content, features.stored_side(data_config.image_size, data_config.image_encoding)
            )
        except Exception as error:  # a bad file must never fail the job
            reason = features.reject_reason(error)
            raise Rejected(reason, features.reject_detail(reason, error)) from None
        return features.encode(pixels, self.label_index(example, vocabularies), data_config.image_encoding), {}

    def feature_spec(self, data_config: ImageDataConfig) -> dict:
        return features.feature_spec(data_config.image_size, data_config.image_encoding)

    def manifest_fields(self, stats, data_config: ImageDataConfig, artifacts, vocabularies) -> dict:
        classes = super().manifest_fields(stats, data_config, artifacts, vocabularies)
        return {"image_size": data_config.image_size, "image_encoding": data_config.image_encoding, **classes}

    def bytes_per_example(self, data_config: ImageDataConfig) -> int:
        side = features.stored_side(data_config.image_size, data_config.image_encoding)
        pixels = side * side * features.CHANNELS
        return (pixels if data_config.image_encoding == "raw" else pixels // JPEG_COMPRESSION) + RECORD_OVERHEAD_BYTES

    # --------------------------------------------------------------- input
    def check_manifest(self, manifest: Manifest, data_config: ImageDataConfig, data_dir: str) -> None:
        size = manifest.get("image_size")
        if data_config.image_size != size:
            raise UserError(
                f"data.image_size={data_config.image_size} but the shards in {data_dir} hold {size}x{size} "
                f"images; set data.image_size={size} or re-run `make preprocess` with the new size"
            )
        encoding = _encoding(manifest)
        if data_config.image_encoding != encoding:
            raise UserError(
                f"data.image_encoding={data_config.image_encoding} but the shards in {data_dir} store {encoding} "
                f"images; set data.image_encoding={encoding} or re-run `make preprocess` with "
                f"data.image_encoding={data_config.image_encoding}"
            )
        # This run's augmentation, in the manifest the export copies: it records how the model was trained.
        manifest["augmentation"] = {"min_crop_area": data_config.min_crop_area} if data_config.augment else None

    def parse_batch(self, serialized, manifest: Manifest, training: bool = False, seed=None, data_config=None):
        # The run's data.augment and data.min_crop_area, read at run time (no preprocessing again); a
        # call of the task's own, without the config, follows what check_manifest recorded.
        if data_config is not None:
            augment, min_crop_area = training and data_config.augment, data_config.min_crop_area
        else:
            recorded = manifest.get("augmentation") if training else None
            augment, min_crop_area = recorded is not None, (recorded or {}).get("min_crop_area", 1.0)
        return features.parse_batch(
            serialized,
            manifest["image_size"],
            _encoding(manifest),
            augment=augment,
            min_crop_area=min_crop_area,
            seed=seed,
        )

    def padding_record(self, manifest: Manifest) -> bytes:
        side = features.stored_side(manifest["image_size"], _encoding(manifest))
        return features.encode(np.zeros((side, side, features.CHANNELS), np.uint8), 0, _encoding(manifest))

    def synthetic_batch(self, batch_size: int, manifest: Manifest):
        import tensorflow as tf

        size = manifest["image_size"]
        images = tf.random.uniform([batch_size, size, size, features.CHANNELS], maxval=256, dtype=tf.int32)
        return tf.cast(images, tf.uint8), self.random_targets(batch_size, manifest)

    def describe_data(self, manifest: Manifest) -> str:
        augmentation = ", augmented" if manifest.get("augmentation") else ""
        images = f"{manifest['image_size']}px images ({_encoding(manifest)}{augmentation})"
        return f"{super().describe_data(manifest)}, {images}"

    # --------------------------------------------------------------- model
    def build_model(self, model_config: ImageModelConfig, manifest: Manifest):
        from .model import build_model  # imports TensorFlow: not needed to read a config

        print(stem.describe(model_config, manifest["image_size"]), flush=True)
        return build_model(model_config, manifest["image_size"], manifest["num_classes"])

    # --------------------------------------------------------------- baselines
    def score_baselines(self, train, evaluation, manifest: Manifest) -> dict[str, float]:
        """The majority class, and a linear least-squares classifier of the image averaged down to
        8x8 pixels per channel."""
        from ..classification import linear_baselines

        return linear_baselines(train, evaluation, manifest["num_classes"], pixels_8x8, "ridge", "linear-8x8-pixels")

    # --------------------------------------------------------------- serving
    def build_serving_signature(self, model, predict_config, objective_config, manifest: Manifest):
        import tensorflow as tf

        size = manifest["image_size"]

        @tf.function(input_signature=[tf.TensorSpec([None, size, size, features.CHANNELS], tf.uint8, name="image")])
        def serve(image):
            return self.serve_logits(model(image, training=False))

        return serve

    def predict_inputs(self, inputs: Sequence[str], manifest: Manifest, export_dir: str):
        import tensorflow as tf

        side = features.stored_side(manifest["image_size"], _encoding(manifest))
        records = []
        for path in inputs:
            if not tf.io.gfile.exists(path):
                raise UserError(f"{path} not found; pass image files, e.g. make predict INPUT=data/raw/circle/x.png")
            with tf.io.gfile.GFile(path, "rb") as handle:
                image_bytes = handle.read()
            try:
                pixels = features.load_image(image_bytes, side)
            except Exception as error:
                reason = features.reject_reason(error)
                raise UserError(
                    f"{path} cannot be read as an image ({features.REJECT_REASONS[reason]}); pass PNG or JPEG files"
                ) from None
            records.append(features.encode(pixels, 0, _encoding(manifest)))
        # Encoded and parsed exactly as preprocessing and evaluation do (JPEG and centre crop
        # included): the model sees the pixels it was evaluated on.
        images, _ = self.parse_batch(tf.constant(records), manifest, training=False)
        return list(inputs), images.numpy()

    # --------------------------------------------------------------- the rest
    def write_sample_data(self, output: Path, seed: int = 0, small: bool = False) -> str:
        per_class = 60 if small else 300
        count = sample_data.write_dataset(output, images_per_class=per_class, seed=seed)
        return (
            f"wrote {count} images in {len(sample_data.CLASSES)} classes + 2 broken files and a README "
            "(to show rejection)"
        )

    def corpora(self) -> dict:
        return CORPORA

    def nominal_manifest(self, data_config: ImageDataConfig) -> dict:
        return {"image_size": data_config.image_size, "image_encoding": data_config.image_encoding, "num_classes": 10}

    def testing(self) -> Testing:
        # 16 px images and a narrow CNN: the same code path in seconds.
        return Testing(
            overrides=("data.image_size=16", "model.widths=[8,16]"),
            rejected=2,
            mismatch="data.image_size=24",
            predict_inputs=_one_image_per_class,
        )

    def width_fix(self, model_config: ImageModelConfig, quantum: int) -> str:
        widths = ",".join(str(max(quantum, math.ceil(width / quantum) * quantum)) for width in model_config.widths)
        return f"model.widths=[{widths}]"

    def doctor_rules(self) -> list:
        return stem.rules()


def _one_image_per_class(raw: Path, scratch: Path) -> list[str]:
    return [str(sorted(folder.glob("*.png"))[0]) for folder in sorted(raw.iterdir()) if folder.is_dir()]


def _encoding(manifest: Manifest) -> str:
    return manifest.get("image_encoding", "raw")


def pixels_8x8(images):
    """images [batch, size, size, channels] (uint8, or floats in [0, 1]) -> [batch, 8 * 8 * channels]:
    the mean of each of 8x8 blocks, in [0, 1]."""
    scale = 255.0 if np.issubdtype(np.asarray(images).dtype, np.integer) else 1.0
    images = np.asarray(images, np.float32)
    batch, size, _, channels = images.shape
    cell = max(1, size // 8)
    side = min(8, size)
    blocks = images[:, : side * cell, : side * cell].reshape(batch, side, cell, side, cell, channels)
    return blocks.mean(axis=(2, 4)).reshape(batch, -1) / scale


TASK = ImageClassificationTask()
