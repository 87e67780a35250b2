"""The feature spec round trip: Beam's encoder -> TFRecord -> tf.data's parser gives back the pixels."""

import numpy as np
import pytest
from PIL import Image

from conftest import run_preprocess
from {{ cookiecutter.package }} import features, input_pipeline, preprocess


def test_encode_parse_round_trip():
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 8, 8, 3), dtype=np.uint8)
    serialized = tf.constant([features.encode(image, label) for image, label in zip(images, [0, 2, 5])])
    parsed_images, labels = features.parse_batch(serialized, 8)
    np.testing.assert_array_equal(parsed_images.numpy(), images)
    assert labels.numpy().tolist() == [0, 2, 5]
    assert parsed_images.shape == (3, 8, 8, 3)  # static batch dimension kept


def test_encode_refuses_wrong_images():
    with pytest.raises(ValueError, match="expected a uint8"):
        features.encode(np.zeros((8, 8), np.uint8), 0)


def test_beam_output_parses_to_the_source_pixels(tmp_path):
    """One image per class, so each record's label names its source file."""
    raw = tmp_path / "raw"
    modes = {"a": ("RGB", (40, 30)), "b": ("L", (17, 50)), "c": ("RGBA", (64, 64)), "d": ("P", (20, 20))}
    rng = np.random.default_rng(1)
    for label, (mode, size) in modes.items():
        (raw / label).mkdir(parents=True)
        pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).convert(mode).save(raw / label / "image.png")
    manifest = run_preprocess(raw, tmp_path / "out", "--image_size", "12", "--eval_fraction", "0.01")
    assert manifest["label_names"] == ["a", "b", "c", "d"]
    assert manifest["feature_spec"] == features.feature_spec(12)

    seen = {}
    for split in ("train", "eval"):
        files, counts = input_pipeline.split_files(str(tmp_path / "out"), manifest, split)
        if not files:  # four images: the eval split may well be empty
            continue
        for batch in input_pipeline.make_dataset(files, counts, 12, 1, training=False):
            image, label, weight = (t.numpy()[0] for t in batch)
            if weight:
                seen[manifest["label_names"][label]] = image
    assert sorted(seen) == ["a", "b", "c", "d"]
    for label, image in seen.items():
        expected = preprocess.load_image((raw / label / "image.png").read_bytes(), 12)
        np.testing.assert_array_equal(image, expected)
