"""The image example: decoding a raw file, the feature spec, encoding and batch parsing.

The Beam encoder (`encode`) and the tf.data parser (`parse_batch`) both come from here, and the
spec is written into manifest.json so that training can refuse shards written by other code.
`load_image` is the one resize rule (shorter side to the target, centre crop: the aspect ratio is
kept), shared by preprocessing and, through `encode` and `parse_batch`, by `predict`.

Two ways to store the pixels (`data.image_encoding`):

- `raw`: uint8 pixels already at `image_size`. A batch parses as one vectorised op, so the host
  does almost nothing; the price is size x size x 3 bytes per example (3 KB at 32 px, 48 KB at
  128 px, 150 KB at 224 px), which is what the host reads from disk or GCS for every example.
- `jpeg`: a re-encoded JPEG of the image at `stored_side` (a margin around `image_size`, as
  ImageNet's 224 from 256), several times smaller. The host decodes it in the parallel map, and
  only the crop: `decode_and_crop_jpeg` skips the rest of the image. Decoding costs host CPU; at
  large sizes reading raw pixels costs more.

Either way a batch reaches the device as static uint8 [batch, image_size, image_size, 3].
"""

from __future__ import annotations

import io
import math
import re

import numpy as np

from ...core import example_proto

CHANNELS = 3
# 2: images keep their aspect ratio (centre crop) and may be stored as JPEG.
SPEC_VERSION = 2
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
# ImageNet's convention: evaluate on a 224 px centre crop of the image resized to 256 px. JPEG
# shards store that margin, so that random training crops and the evaluation crop come from it.
CROP_MARGIN = 256 / 224
JPEG_QUALITY = 90
# Random-resized crop (Inception-style): aspect ratios between 3/4 and 4/3; the smallest area is
# `data.min_crop_area`.
CROP_ASPECT_RANGE = (3 / 4, 4 / 3)
# Why a file was rejected: the code counted in the metrics and the manifest, and its meaning.
REJECT_REASONS = {
    "empty": "empty file",
    "truncated": "truncated: the file ends before the image data does",
    "not_an_image": "not an image: no known image format (wrong extension or another kind of file)",
    "corrupt": "corrupt image data",
}


class EmptyFileError(ValueError):
    pass


def stored_side(image_size: int, encoding: str) -> int:
    """Side in pixels of the images in the shards: `image_size` for raw, with the crop margin for JPEG."""
    return image_size if encoding == "raw" else round(image_size * CROP_MARGIN)


def load_image(image_bytes: bytes, side: int) -> np.ndarray:
    """Decodes any PIL-readable image to uint8 RGB [side, side, 3]: the shorter side resized to
    `side`, then the centre square (the aspect ratio is kept). Raises on a file that is empty,
    truncated or not a decodable image."""
    from PIL import Image, ImageFile, ImageOps

    if not image_bytes:
        raise EmptyFileError("empty file")
    # With this True, PIL fills the missing part of a truncated image with grey instead of raising:
    # a half-written upload would become a training example. It is False by default; another
    # library in the same worker process may have set it, so it is forced here.
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    with Image.open(io.BytesIO(image_bytes)) as image:
        # A large JPEG decodes at 1/2, 1/4 or 1/8 scale when that still covers `side`: the
        # decoder skips the detail the resize would throw away (several times faster on photos).
        image.draft(None, (side, side))
        image.load()  # decodes every pixel now: raises OSError on truncated data
        if image.mode in ("P", "LA") or (image.mode == "RGBA"):
            image = image.convert("RGBA")
            # Transparent pixels become black, as on a TPU there is no alpha channel to carry.
            background = Image.new("RGBA", image.size, (0, 0, 0, 255))
            image = Image.alpha_composite(background, image)
        # Crop to the centre square first, then resize only that: stretching a 4:3 photo into a
        # square would teach the model shapes that do not exist.
        image = ImageOps.fit(image.convert("RGB"), (side, side), Image.Resampling.BILINEAR)
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


def feature_spec(image_size: int, encoding: str = "raw") -> dict:
    """JSON-friendly description of an example; stored in the manifest and compared at start-up."""
    side = stored_side(image_size, encoding)
    image = {"dtype": "uint8", "shape": [side, side, CHANNELS], "encoding": encoding}
    if encoding == "jpeg":
        image["quality"] = JPEG_QUALITY
    return {"version": SPEC_VERSION, "image": image, "label": {"dtype": "int64", "shape": []}}


def encode(image: np.ndarray, label: int, encoding: str = "raw") -> bytes:
    """Serialises one example; `image` is uint8 [side, side, 3] from `load_image`."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != CHANNELS:
        raise ValueError(f"expected a uint8 [H, W, {CHANNELS}] image, got {image.dtype} {image.shape}")
    if encoding == "jpeg":
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, "JPEG", quality=JPEG_QUALITY)
        pixels = buffer.getvalue()
    else:
        pixels = image.tobytes()
    # Written without TensorFlow: Beam's workers never import it.
    return example_proto.example(
        {"image": example_proto.bytes_feature([pixels]), "label": example_proto.int64_feature([int(label)])}
    )


# ----------------------------------------------------------------------------- tf.data (host side)


def centre_windows(batch_size, side: int, image_size: int):
    """[batch, 4] int32 (y, x, height, width): the centre `image_size` square of a `side` square."""
    import tensorflow as tf

    offset = (side - image_size) // 2
    return tf.tile(tf.constant([[offset, offset, image_size, image_size]], tf.int32), [batch_size, 1])


def uniform(shape, seed, draw: int, minval=0.0, maxval=1.0):
    """Floats uniform in [minval, maxval): with a `seed` (an int64 [2] stateless key, `Task.parse_batch`'s),
    a pure function of it and `draw` (which of the batch's draws this is), so the same batch draws the
    same numbers in every run; without one, unseeded (a benchmark's draws)."""
    import tensorflow as tf

    if seed is None:
        return tf.random.uniform(shape, minval, maxval)
    key = tf.random.experimental.stateless_fold_in(seed, draw)
    return tf.random.stateless_uniform(shape, key, minval, maxval)


def random_windows(batch_size, side: int, min_area: float, seed=None):
    """[batch, 4] int32 (y, x, height, width) random-resized-crop windows inside a `side` square:
    area uniform in [min_area, 1] of the image, log-uniform aspect ratio in CROP_ASPECT_RANGE, and a
    uniform position. A window too wide or too tall for the image is clipped to it (torchvision
    resamples instead; clipping keeps this one vectorised op per batch). Drawn from `seed` (see
    `uniform`): example i of a batch gets the i-th numbers of each draw."""
    import tensorflow as tf

    area = uniform([batch_size], seed, 0, min_area, 1.0) * side * side
    log_low, log_high = (math.log(ratio) for ratio in CROP_ASPECT_RANGE)
    aspect = tf.exp(uniform([batch_size], seed, 1, log_low, log_high))
    width = tf.clip_by_value(tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32), 1, side)
    height = tf.clip_by_value(tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32), 1, side)
    y = tf.cast(uniform([batch_size], seed, 2) * tf.cast(side - height + 1, tf.float32), tf.int32)
    x = tf.cast(uniform([batch_size], seed, 3) * tf.cast(side - width + 1, tf.float32), tf.int32)
    return tf.stack([tf.minimum(y, side - height), tf.minimum(x, side - width), height, width], axis=1)


def crop_windows(images, windows, image_size: int, encoding: str, resize: bool):
    """Each example's window, at `image_size`: `images` is a batch of JPEG strings (only the
    window is decoded) or of uint8 [side, side, 3] pixels. With `resize` (random crops, of any
    size) each crop is resized to `image_size`, bilinearly; without, the windows must already be
    `image_size` square. One example at a time (`map_fn`): JPEG has no batched decoder, and the
    windows differ in size."""
    import tensorflow as tf

    def crop_one(args):
        image, window = args
        if encoding == "jpeg":
            crop = tf.io.decode_and_crop_jpeg(image, window, channels=CHANNELS)
        else:
            crop = tf.slice(image, [window[0], window[1], 0], [window[2], window[3], CHANNELS])
        if not resize:
            return tf.ensure_shape(crop, [image_size, image_size, CHANNELS])
        resized = tf.image.resize(crop, [image_size, image_size], method="bilinear")
        return tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)

    return tf.map_fn(
        crop_one, (images, windows), fn_output_signature=tf.TensorSpec([image_size, image_size, CHANNELS], tf.uint8)
    )


def random_flip(images, seed=None):
    """Mirrors a random half of a uint8 [batch, H, W, 3] batch left-right (one vectorised select),
    drawn from `seed` (see `uniform`)."""
    import tensorflow as tf

    flip = uniform([tf.shape(images)[0]], seed, 4) < 0.5
    return tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)


def parse_batch(
    serialized,
    image_size: int,
    encoding: str = "raw",
    augment: bool = False,
    min_crop_area: float = 1.0,
    seed=None,
):
    """Parses a batch of serialized examples into (uint8 images [B, size, size, 3], int32 labels [B]).

    `augment` (training only): a random-resized crop and a random horizontal flip per example, drawn
    from the batch's `seed` (an int64 [2] stateless key: the same key, the same crops and flips;
    None draws unseeded); otherwise the centre `image_size` crop (JPEG) or the stored pixels (raw),
    the same every time."""
    import tensorflow as tf

    parsed = tf.io.parse_example(
        serialized,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    # Keep the batch dimension static when the batch was made with drop_remainder=True.
    static_batch = serialized.shape[0] if serialized.shape.rank else None
    batch_size = tf.shape(serialized)[0]
    side = stored_side(image_size, encoding)
    images = parsed["image"]
    if encoding == "raw":
        images = tf.reshape(tf.io.decode_raw(images, tf.uint8), [-1, side, side, CHANNELS])
    if augment:
        windows = random_windows(batch_size, side, min_crop_area, seed)
        images = random_flip(crop_windows(images, windows, image_size, encoding, resize=True), seed)
    elif encoding == "jpeg":
        windows = centre_windows(batch_size, side, image_size)
        images = crop_windows(images, windows, image_size, encoding, resize=False)
    images = tf.ensure_shape(images, [static_batch, image_size, image_size, CHANNELS])
    return images, tf.cast(parsed["label"], tf.int32)
