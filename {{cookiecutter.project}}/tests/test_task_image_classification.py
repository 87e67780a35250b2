"""The image task: decoding and rejecting raw files, the feature spec round trip (Beam's
encoder -> TFRecord -> tf.data's parser gives back the pixels, raw or JPEG), training crops (drawn
from each batch's key, so a resumed input crops as the uninterrupted one did), deterministic
evaluation and predict, and the CSV index as raw input."""

import io
import json

import numpy as np
import pytest
from PIL import Image

import conftest
from test_doctor import check
from test_preprocess import assert_exact
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core import config, input_pipeline
from {{ cookiecutter.package }}.core import preprocessing
from {{ cookiecutter.package }}.doctor import engine
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.tasks.image_classification import features
from {{ cookiecutter.package }}.tasks.image_classification.task import TASK, pixels_8x8


def run_preprocess(raw, output, *extra: str) -> dict:
    """The real Beam pipeline with this task's own config (a project may hold other tasks too)."""
    return conftest.run_preprocess(raw, output, "--config", str(conftest.config_file(TASK.name)), *extra)


def image_bytes(fmt: str, seed: int, size: int = 64) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def write_images(folder, names, size=(40, 30)) -> None:
    """A different smooth RGB PNG (random colours, blended like a photo) per name under `folder`."""
    for index, name in enumerate(names):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        colours = np.random.default_rng(index).integers(0, 256, (3, 4, 3), dtype=np.uint8)
        Image.fromarray(colours).resize(size, Image.Resampling.BILINEAR).save(path)


def read_split(data_dir, manifest, split):
    """(images, labels) of a split, in the evaluation pipeline's order, padding left out."""
    files, counts = input_pipeline.split_files(str(data_dir), manifest, split)
    images, labels = [], []
    for batch_images, batch_labels, weights in input_pipeline.eval_pipeline(files, counts, TASK, manifest, 4):
        keep = weights.numpy() > 0
        images += list(batch_images.numpy()[keep])
        labels += [manifest["label_names"][label] for label in batch_labels.numpy()[keep]]
    return images, labels


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
    manifest = run_preprocess(raw, tmp_path / "out", "data.image_size=12", "data.eval_fraction=0.01")
    assert manifest["label_names"] == ["a", "b", "c", "d"]
    assert manifest["feature_spec"] == features.feature_spec(12)

    seen = {}
    for split in ("train", "eval"):
        files, counts = input_pipeline.split_files(str(tmp_path / "out"), manifest, split)
        if not files:  # four images: the eval split may well be empty
            continue
        for batch in input_pipeline.eval_pipeline(files, counts, TASK, manifest, 1):
            image, label, weight = (t.numpy()[0] for t in batch)
            if weight:
                seen[manifest["label_names"][label]] = image
    assert sorted(seen) == ["a", "b", "c", "d"]
    for label, image in seen.items():
        expected = features.load_image((raw / label / "image.png").read_bytes(), 12)
        np.testing.assert_array_equal(image, expected)


def test_truncated_images_do_not_decode(monkeypatch):
    from PIL import ImageFile

    # Even when another library has told PIL to decode truncated files (grey fill), they fail here.
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    for fmt in ("JPEG", "PNG"):
        data = image_bytes(fmt, seed=0)
        assert features.load_image(data, 8).shape == (8, 8, 3)
        with pytest.raises(OSError) as caught:
            features.load_image(data[: len(data) // 2], 8)
        assert features.reject_reason(caught.value) == "truncated"


def test_bad_inputs_are_rejected_and_counted(tmp_path, capsys):
    raw = tmp_path / "raw"
    for label in ("a", "b"):
        (raw / label).mkdir(parents=True)
        for index in range(3):
            (raw / label / f"ok_{index}.png").write_bytes(image_bytes("PNG", seed=index))
            (raw / label / f"ok_{index}.jpg").write_bytes(image_bytes("JPEG", seed=index))
    jpeg, png = image_bytes("JPEG", seed=7), image_bytes("PNG", seed=7)
    bad = {
        "a/empty.png": (b"", "empty"),
        "a/half.jpg": (jpeg[: len(jpeg) // 2], "truncated"),
        "b/half.png": (png[: len(png) // 2], "truncated"),
        "b/text.jpeg": (b"not an image\n" * 20, "not_an_image"),
        "b/upper.PNG": (b"\x00" * 100, "not_an_image"),
    }
    for relative, (data, _) in bad.items():
        (raw / relative).write_bytes(data)
    (raw / "README.md").write_text("ignored\n")
    (raw / "a" / "notes.txt").write_text("ignored\n")
    (raw / "a" / "nested").mkdir()
    (raw / "a" / "nested" / "deep.png").write_bytes(image_bytes("PNG", seed=1))  # not RAW/<label>/<file>

    output = tmp_path / "out"
    manifest = run_preprocess(raw, output, "data.image_size=8")
    printed = capsys.readouterr().out

    assert manifest["rejected"]["count"] == len(bad)
    assert manifest["rejected"]["by_reason"] == {"empty": 1, "not_an_image": 2, "truncated": 2}
    assert manifest["ignored_files"] == 3
    rejected = [json.loads(line) for line in (output / "rejected.jsonl").read_text().splitlines()]
    assert {(r["source"], r["reason"]) for r in rejected} == {
        (str(raw / relative), reason) for relative, (_, reason) in bad.items()
    }
    assert all(r["detail"] and " at 0x" not in r["detail"] for r in rejected)
    assert sum(info["num_examples"] for info in manifest["splits"].values()) == 12
    assert_exact(output, manifest)
    # The Beam metrics, printed at the end.
    assert "read 17, written 12, rejected 5" in printed
    assert "'truncated': 2" in printed and "'empty': 1" in printed


def test_resizing_keeps_the_aspect_ratio():
    """A 3:1 image of blue | green | red thirds: the centre square is the green third, not a
    squashed mix of all three."""
    pixels = np.zeros((30, 90, 3), np.uint8)
    pixels[:, :30, 2] = pixels[:, 30:60, 1] = pixels[:, 60:, 0] = 255
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    image = features.load_image(buffer.getvalue(), 10)
    assert image.shape == (10, 10, 3)
    # Squashed, each colour would average 85; the filter only blurs the crop's edges.
    np.testing.assert_allclose(image.reshape(-1, 3).mean(axis=0), [0, 255, 0], atol=10)


def test_jpeg_shards_round_trip_with_static_shapes(tmp_path):
    raw = tmp_path / "raw"
    write_images(raw, [f"{label}/{index}.png" for label in ("a", "b") for index in range(6)])
    output = tmp_path / "out"
    manifest = run_preprocess(
        raw, output, "data.image_size=16", "data.image_encoding=jpeg", "data.eval_fraction=0.3", "--num_shards", "2"
    )
    assert manifest["image_encoding"] == "jpeg"
    assert manifest["feature_spec"]["image"] == {
        "dtype": "uint8",
        "shape": [18, 18, 3],
        "encoding": "jpeg",
        "quality": features.JPEG_QUALITY,
    }
    data_config = config.load(
        None,
        ["task=image_classification", "data.image_size=16", "data.image_encoding=jpeg", "data.augment=true"],
        registry=tasks,
    ).data
    manifest = input_pipeline.read_manifest(str(output), TASK, data_config)  # the code accepts its own JPEG spec

    files, counts = input_pipeline.split_files(str(output), manifest, "train")
    for dataset in (
        input_pipeline.train_pipeline(files, counts, TASK, manifest, 4, seed=0),
        input_pipeline.eval_pipeline(files, counts, TASK, manifest, 4),
    ):
        assert dataset.element_spec[0].shape == (4, 16, 16, 3) and dataset.element_spec[0].dtype.name == "uint8"
        images = next(iter(dataset))[0].numpy()
        assert images.std() > 20  # decoded pixels, not a blank image

    # Evaluation sees the centre 16 px of the 18 px image Beam stored, up to JPEG's loss.
    images, labels = read_split(output, manifest, "eval")
    assert images and len(labels) == manifest["splits"]["eval"]["num_examples"]
    by_file = {}
    for label in ("a", "b"):
        for path in sorted((raw / label).iterdir()):
            by_file[path] = features.load_image(path.read_bytes(), 18)[1:17, 1:17]
    for image in images:
        errors = [np.abs(image.astype(int) - expected).mean() for expected in by_file.values()]
        assert min(errors) < 8 < sorted(errors)[1]  # close to exactly one source image


def test_jpeg_shards_are_smaller_than_raw(tmp_path):
    """Smooth images (like photos) at 64 px: JPEG stores a fraction of the raw pixels' bytes."""
    raw = tmp_path / "raw"
    write_images(raw, [f"a/{index}.png" for index in range(4)], size=(96, 80))
    sizes = {}
    for encoding in ("raw", "jpeg"):
        manifest = run_preprocess(raw, tmp_path / encoding, "data.image_size=64", f"data.image_encoding={encoding}")
        sizes[encoding] = sum(split["bytes"] for split in manifest["splits"].values())
    assert sizes["jpeg"] * 3 < sizes["raw"]


def test_random_crops_stay_inside_the_image():
    import tensorflow as tf

    tf.random.set_seed(0)
    for side, min_area in ((146, 0.08), (37, 0.25), (5, 0.5), (1, 0.25), (20, 1.0)):
        y, x, height, width = features.random_windows(4000, side, min_area).numpy().T
        assert (y >= 0).all() and (x >= 0).all() and (height >= 1).all() and (width >= 1).all()
        assert (y + height <= side).all() and (x + width <= side).all()
        if side > 30:
            assert len(set(zip(y, x, height, width))) > 100  # random, not one window
            assert (height * width).min() >= int(min_area * side * side * 0.75)  # clipped at most by 3/4
    y, x, height, width = features.centre_windows(3, 146, 128).numpy().T
    assert (y == 9).all() and (x == 9).all() and (height == 128).all() and (width == 128).all()


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_training_crops_and_flips_evaluation_does_not(encoding):
    import tensorflow as tf

    tf.random.set_seed(0)
    side = features.stored_side(16, encoding)
    rng = np.random.default_rng(0)
    records = tf.constant(
        [features.encode(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), label, encoding) for label in range(8)]
    )
    manifest = {"image_size": 16, "image_encoding": encoding, "num_classes": 8}
    data_config = config.load(
        None,
        ["task=image_classification", "data.image_size=16", f"data.image_encoding={encoding}", "data.augment=true"],
        registry=tasks,
    ).data
    TASK.check_manifest(manifest, data_config, "data")

    first, second = (TASK.parse_batch(records, manifest, training=True)[0].numpy() for _ in range(2))
    assert first.shape == (8, 16, 16, 3) and not np.array_equal(first, second)
    evaluation = [TASK.parse_batch(records, manifest, training=False)[0].numpy() for _ in range(2)]
    np.testing.assert_array_equal(*evaluation)
    # Training without data.augment takes the evaluation view.
    TASK.check_manifest(
        manifest,
        config.load(
            None, ["task=image_classification", "data.image_size=16", f"data.image_encoding={encoding}"], registry=tasks
        ).data,
        "data",
    )
    np.testing.assert_array_equal(TASK.parse_batch(records, manifest, training=True)[0].numpy(), evaluation[0])


def augmented_images(records, manifest, key):
    import tensorflow as tf

    return TASK.parse_batch(records, manifest, training=True, seed=tf.constant(key, tf.int64))[0].numpy()


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_training_crops_and_flips_are_a_function_of_the_batch_key(encoding):
    """A batch's random crops and flips are drawn from its key alone: the same key gives the same
    images whatever was drawn before and whatever the global seed, another key other images."""
    import tensorflow as tf

    side = features.stored_side(16, encoding)
    rng = np.random.default_rng(0)
    records = tf.constant(
        [features.encode(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), label, encoding) for label in range(8)]
    )
    manifest = {"image_size": 16, "image_encoding": encoding, "num_classes": 8}
    data_config = config.load(
        None,
        ["task=image_classification", "data.image_size=16", f"data.image_encoding={encoding}", "data.augment=true"],
        registry=tasks,
    ).data
    TASK.check_manifest(manifest, data_config, "data")
    tf.random.set_seed(0)
    first = augmented_images(records, manifest, [3, 5])
    tf.random.set_seed(1)
    tf.random.uniform([7])  # another global seed, and a stateful draw in between
    np.testing.assert_array_equal(augmented_images(records, manifest, [3, 5]), first)
    evaluation = TASK.parse_batch(records, manifest, training=False)[0].numpy()
    for other in ([3, 6], [4, 5]):
        images = augmented_images(records, manifest, other)
        assert not np.array_equal(images, first) and not np.array_equal(images, evaluation), other
    # Each example its own crop: not one window (or flip) for the whole batch.
    windows = features.random_windows(64, side, 0.25, tf.constant([3, 5], tf.int64)).numpy()
    assert len({tuple(window) for window in windows}) > 32


def test_a_resumed_train_input_crops_and_flips_as_the_uninterrupted_one(tmp_path):
    """The train input restarted after 3 batches (as a resumed run restarts it) gives batches 3, 4 and 5
    of the uninterrupted input, their augmentation included, pixel for pixel."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    files = [str(tmp_path / f"train-{index}.tfrecord") for index in range(2)]
    for path in files:
        with tf.io.TFRecordWriter(path) as writer:
            for label in range(20):
                writer.write(features.encode(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), label % 4))
    manifest = {"image_size": 16, "image_encoding": "raw", "num_classes": 4}
    TASK.check_manifest(
        manifest,
        config.load(
            None, ["task=image_classification", "data.image_size=16", "data.augment=true"], registry=tasks
        ).data,
        "data",
    )

    def batches(start: int, count: int) -> list:
        dataset = input_pipeline.train_pipeline(
            files, [20, 20], TASK, manifest, 8, seed=5, shuffle_buffer=16, start=start
        )
        return [(images.numpy(), labels.numpy()) for images, labels in dataset.take(count)]

    uninterrupted, resumed = batches(0, 6), batches(3 * 8, 3)
    for (images, labels), (want_images, want_labels) in zip(resumed, uninterrupted[3:]):
        np.testing.assert_array_equal(labels, want_labels)
        np.testing.assert_array_equal(images, want_images)
    assert not np.array_equal(uninterrupted[0][0], uninterrupted[5][0])


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_predict_sees_what_evaluation_sees(tmp_path, encoding):
    """predict's pixels for a file are the evaluation pipeline's pixels for it, every time."""
    raw = tmp_path / "raw"
    write_images(raw, ["a/wide.png", "b/tall.png"], size=(50, 20))
    write_images(raw, ["c/small.png"], size=(7, 9))
    output = tmp_path / "out"
    manifest = run_preprocess(
        raw, output, "data.image_size=12", f"data.image_encoding={encoding}", "data.eval_fraction=0.99"
    )
    assert manifest["splits"]["eval"]["num_examples"] == 3
    images, labels = read_split(output, manifest, "eval")
    paths = [str(raw / label / name) for label, name in (("a", "wide.png"), ("b", "tall.png"), ("c", "small.png"))]
    names, predicted = TASK.predict_inputs(paths, manifest, str(tmp_path / "export"))
    assert names == paths and predicted.shape == (3, 12, 12, 3)
    np.testing.assert_array_equal(TASK.predict_inputs(paths, manifest, str(tmp_path / "export"))[1], predicted)
    for image, label in zip(images, labels):
        np.testing.assert_array_equal(image, predicted["abc".index(label)])


def test_the_shards_encoding_must_match_the_config(tmp_path):
    manifest = {"image_size": 16, "image_encoding": "raw"}
    data_config = config.load(
        None, ["task=image_classification", "data.image_size=16", "data.image_encoding=jpeg"], registry=tasks
    ).data
    with pytest.raises(
        UserError,
        match="data.image_encoding=jpeg but the shards in d store raw images; "
        "set data.image_encoding=raw or re-run `make preprocess`",
    ):
        TASK.check_manifest(manifest, data_config, "d")


def test_csv_index_with_and_without_ml_use(tmp_path):
    images = tmp_path / "images"
    names = [f"{label}_{index}.png" for label in ("cat", "dog") for index in range(8)]
    write_images(images, names)
    index = tmp_path / "index" / "labels.csv"
    index.parent.mkdir()
    # ML_USE on the first rows; the rest split by the hash of the path as written. Only the relative
    # paths' hashes are known in advance (an absolute one holds pytest's temporary folder): these
    # relative rows split both ways.
    uses = ["training", "validation", "test", "TRAINING", "", ""] + [""] * 10
    rows = []
    for position, (name, use) in enumerate(zip(names, uses)):
        path = str(images / name) if position % 2 else f"../images/{name}"  # absolute and relative
        rows.append((use, path, name.split("_")[0]) if position < 6 else (path, name.split("_")[0]))
    index.write_text("".join(",".join(row) + "\n" for row in rows) + "\n")  # a blank last line

    output = tmp_path / "out"
    manifest = run_preprocess(index, output, "data.image_size=8", "data.eval_fraction=0.5")
    assert manifest["label_names"] == ["cat", "dog"] and manifest["rejected"]["count"] == 0
    assert manifest["ignored_files"] == 0 and manifest["source"] == str(index)
    forced = {"training": "train", "validation": "eval", "test": "eval", "TRAINING": "train"}
    expected = [forced.get(row[0]) or preprocessing.split_of(row[-2], 0.5) for row in rows]
    assert expected[:4] == ["train", "eval", "eval", "train"]
    assert {split for row, split in zip(rows[4:], expected[4:]) if row[-2].startswith("..")} == {"train", "eval"}
    for split in ("train", "eval"):
        assert manifest["splits"][split]["num_examples"] == expected.count(split)
    # The pixels come from the rows' files: each eval image is one of the images.
    eval_images, _ = read_split(output, manifest, "eval")
    sources = [features.load_image((images / name).read_bytes(), 8) for name in names]
    assert all(any(np.array_equal(image, source) for source in sources) for image in eval_images)


def test_bad_csv_rows_are_rejected_with_their_reason(tmp_path):
    write_images(tmp_path, ["img/ok_1.png", "img/ok_2.png", "img/ok_3.png"])
    (tmp_path / "img" / "broken.jpg").write_bytes(b"not a jpeg")
    lines = [
        "training,img/ok_1.png,cat",  # 1 ok
        "img/ok_2.png,dog",  # 2 ok
        "train,img/ok_3.png,cat",  # 3 ML_USE is `training`, not `train`
        "validation,img/ok_3.png,",  # 4 empty label
        "test,img/ok_3.png",  # 5 ML_USE and a path, no label
        "img/missing.png,cat",  # 6 no such file
        "training,img/ok_3.png,cat,dog",  # 7 multi-label: four columns
        ",,cat",  # 8 no path
        "img/broken.jpg,dog",  # 9 not an image
    ]
    index = tmp_path / "index.csv"
    index.write_text("\n".join(lines) + "\n")
    output = tmp_path / "out"
    manifest = run_preprocess(index, output, "data.image_size=8")

    assert manifest["rejected"]["by_reason"] == {
        "bad_ml_use": 1,
        "bad_row": 2,
        "empty_label": 2,
        "missing": 1,
        "not_an_image": 1,
    }
    assert sum(split["num_examples"] for split in manifest["splits"].values()) == 2
    rejected = {r["source"]: r for r in map(json.loads, (output / "rejected.jsonl").read_text().splitlines())}
    assert {source: r["reason"] for source, r in rejected.items()} == {
        f"{tmp_path}/index.csv:3": "bad_ml_use",
        f"{tmp_path}/index.csv:4": "empty_label",
        f"{tmp_path}/index.csv:5": "empty_label",
        f"{tmp_path}/img/missing.png": "missing",
        f"{tmp_path}/index.csv:7": "bad_row",
        f"{tmp_path}/index.csv:8": "bad_row",
        f"{tmp_path}/img/broken.jpg": "not_an_image",
    }
    assert "'train'" in rejected[f"{tmp_path}/index.csv:3"]["detail"]
    assert_exact(output, manifest)


def test_a_missing_csv_index_says_what_raw_must_be(tmp_path):
    with pytest.raises(UserError, match="index.csv not found; RAW must be an image folder or a CSV index"):
        TASK.list_raw(str(tmp_path / "index.csv"))


def test_csv_index_on_gcs(gcs_bucket, tmp_path):
    """RAW=gs://.../index.csv, with rows relative to its folder and rows naming gs:// URIs."""
    from apache_beam.io.filesystems import FileSystems

    def upload(path, data: bytes):
        with FileSystems.create(path) as handle:
            handle.write(data)

    write_images(tmp_path, ["a.png", "b.png", "c.png"])
    for name in ("a.png", "b.png"):
        upload(gcs_bucket.path("csv", "images", name), (tmp_path / name).read_bytes())
    elsewhere = gcs_bucket.path("elsewhere", "c.png")
    upload(elsewhere, (tmp_path / "c.png").read_bytes())
    index = gcs_bucket.path("csv", "index.csv")
    rows = ["training,images/a.png,x", "validation,images/b.png,y", f"test,{elsewhere},x", "training,images/gone.png,y"]
    upload(index, ("\n".join(rows) + "\n").encode())

    output = tmp_path / "out"
    manifest = run_preprocess(index, output, "data.image_size=8")
    assert manifest["splits"]["train"]["num_examples"] == 1 and manifest["splits"]["eval"]["num_examples"] == 2
    [rejected] = map(json.loads, (output / "rejected.jsonl").read_text().splitlines())
    assert (rejected["source"], rejected["reason"]) == (gcs_bucket.path("csv", "images", "gone.png"), "missing")
    assert gcs_bucket.blocked_requests() == []


# ----------------------------------------------------------------------------- the image model's doctor rules


def test_mxu_rules_skip_cpu_targets(data_dir, tmp_path):
    results = check(data_dir, "model.widths=[100,128]", tmp_path=tmp_path)
    assert results["model.feature_dims"].status == engine.SKIP
    assert f"CONFIG={config.shipped_config(TASK.name, 'tpu', registry=tasks)}`" in results["model.feature_dims"].message


def test_feature_dims_name_the_padded_layers_but_not_the_logits(data_dir, tmp_path):
    results = check(data_dir, "model.widths=[100,128]", tmp_path=tmp_path, target="tpu")
    rule = results["model.feature_dims"]
    assert rule.status == engine.WARN
    assert "100: stem_conv" in rule.message and "logits" not in rule.message
    assert rule.fix == "model.widths=[128,128]"
    assert "stem_conv (100)" in results["model.narrow_layers"].message


def test_mxu_widths_pass_and_8_suffices_at_a_batch_of_1024(data_dir, tmp_path):
    results = check(data_dir, "model.widths=[128,256]", tmp_path=tmp_path, target="tpu")
    assert results["model.feature_dims"].status == engine.PASS
    assert results["model.narrow_layers"].status == engine.PASS
    results = check(data_dir, "model.widths=[64,136]", "train.global_batch_size=1024", tmp_path=tmp_path, target="tpu")
    assert results["model.feature_dims"].status == engine.PASS
    narrow = results["model.narrow_layers"]
    assert narrow.status == engine.WARN and "stem_conv (64)" in narrow.message and "(136)" not in narrow.message


def test_hidden_dense_layers_under_512_are_flagged(data_dir, tmp_path, monkeypatch):
    from {{ cookiecutter.package }}.core import model
    from {{ cookiecutter.package }}.core.keras import keras

    def mlp(cfg, task, manifest):
        size, num_classes = manifest["image_size"], manifest["num_classes"]
        images = keras.Input(shape=(size, size, 3), name="image")
        x = keras.layers.Flatten()(images)
        x = keras.layers.Dense(200, name="hidden")(x)
        return keras.Model(images, keras.layers.Dense(num_classes, name="logits")(x))

    monkeypatch.setattr(model, "build_model", mlp)
    results = check(data_dir, tmp_path=tmp_path, target="tpu")
    assert results["model.hidden_dense"].status == engine.WARN
    assert "hidden (200)" in results["model.hidden_dense"].message
    assert "200: hidden" in results["model.feature_dims"].message
    assert results["model.batch_norm"].status == engine.SKIP


def test_the_local_defaults_have_no_hidden_dense_layer(data_dir, tmp_path):
    assert check(data_dir, tmp_path=tmp_path)["model.hidden_dense"].status == engine.SKIP


def test_a_model_that_does_not_build_fails(data_dir, tmp_path, monkeypatch):
    from {{ cookiecutter.package }}.core import model

    def broken(*args):
        raise ValueError("no such layer")

    monkeypatch.setattr(model, "build_model", broken)
    results = check(data_dir, tmp_path=tmp_path)
    assert results["model.build"].status == engine.FAIL and "no such layer" in results["model.build"].message
    assert results["model.feature_dims"].status == engine.SKIP


def test_small_per_replica_batch_with_batch_norm_warns(data_dir, tmp_path):
    rule = check(data_dir, tmp_path=tmp_path)["model.batch_norm"]  # 128 / 8 = 16 per replica
    assert rule.status == engine.WARN and "16 examples per replica" in rule.message
    assert "model.sync_batch_norm=true" in rule.fix and "train.global_batch_size=256" in rule.fix
    assert check(data_dir, "model.sync_batch_norm=true", tmp_path=tmp_path)["model.batch_norm"].status == engine.PASS
    assert check(data_dir, "train.global_batch_size=256", tmp_path=tmp_path)["model.batch_norm"].status == engine.PASS


# ----------------------------------------------------------------------------- the stem's stride


def test_auto_stem_stride_follows_the_image_size():
    from {{ cookiecutter.package }}.tasks.image_classification import stem

    assert [stem.stride_for(size) for size in (16, 32, 48, 64, 96, 128, 224, 512)] == [1, 1, 1, 2, 2, 4, 4, 4]
    auto = config.load(None, ["task=image_classification", "data.image_size=128"], registry=tasks)
    assert auto.model.stem_stride == "auto" and stem.stem_stride(auto.model, 128) == 4
    explicit = config.load(
        None, ["task=image_classification", "data.image_size=128", "model.stem_stride=2"], registry=tasks
    )
    assert stem.stem_stride(explicit.model, 128) == 2
    assert stem.describe(auto.model, 128) == "stem stride 4 (auto for 128 px images): first stage at 32x32 px"
    with pytest.raises(config.ConfigError, match="model.stem_stride must be an integer or 'auto'"):
        config.load(None, ["task=image_classification", "model.stem_stride=big"], registry=tasks)


def test_the_built_model_uses_the_auto_stride(capsys):
    model = TASK.build_model(
        config.load(None, ["task=image_classification", "model.widths=[8,16]"], registry=tasks).model,
        {"image_size": 64, "num_classes": 3},
    )
    assert model.get_layer("stem_conv").strides == (2, 2)
    assert model.get_layer("stage0_block0_out").output.shape[1:3] == (32, 32)
    assert "stem stride 2 (auto for 64 px images)" in capsys.readouterr().out


def conv_flops(side: int, kernel: int, channels_in: int, channels_out: int) -> int:
    """2 x the multiply-adds of a convolution whose output is side x side."""
    return 2 * side * side * kernel * kernel * channels_in * channels_out


@pytest.mark.parametrize("which, stem_stride", [("local", 1), ("tpu", 2)])
def test_the_trainers_flops_per_step_are_the_cnns_layers_counted_by_hand(which, stem_stride):
    """What the log's TFLOP/s and MFU divide (utilisation.flops_per_step, which the trainer calls) is
    exactly the CNN's convolutions and logits counted layer by layer, x 3 for the step's backward
    pass, times the examples of an update (the global batch x 2 steps of accumulation). The stem's
    stride is auto: 1 for the local config's 32 px, 2 for the TPU config's 64 px."""
    from conftest import config_file
    from {{ cookiecutter.package }}.core import topology, utilisation
    from {{ cookiecutter.package }}.core.model import build_model

    cfg = config.load(str(config_file(TASK.name, which)), ["train.gradient_accumulation_steps=2"], registry=tasks)
    manifest = TASK.nominal_manifest(cfg.data)
    model = build_model(cfg, TASK, manifest)
    side = -(-cfg.data.image_size // stem_stride)  # "same" padding rounds up
    forward = conv_flops(side, max(3, stem_stride), 3, cfg.model.widths[0])
    channels = cfg.model.widths[0]
    for stage, width in enumerate(cfg.model.widths):
        for block in range(cfg.model.blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            side = -(-side // stride)
            forward += conv_flops(side, 3, channels, width) + conv_flops(side, 3, width, width)
            if stride != 1 or channels != width:  # the shortcut's 1x1 projection
                forward += conv_flops(side, 1, channels, width)
            channels = width
    forward += 2 * channels * manifest["num_classes"]  # the logits of the pooled features
    by_hand = 3 * forward * cfg.train.global_batch_size * 2
    counted = utilisation.flops_per_step(model, cfg, topology.topology("v5litepod-8"))
    assert counted == pytest.approx(by_hand, rel=1e-9)


def test_a_large_first_stage_warns_and_names_the_stride(data_dir, tmp_path):
    from {{ cookiecutter.package }}.tasks.image_classification import stem
    from {{ cookiecutter.package }}.core.topology import Target

    target = Target("cpu", 8, 1)
    full = config.load(
        None,
        [
            "task=image_classification",
            "data.image_size=128",
            "model.stem_stride=1",
            "model.widths=[16,32]",
            "runtime.mixed_precision=float32",
        ],
        registry=tasks,
    )
    status, message, fix = stem.first_stage_activations(full, target, None)
    assert status == "warn" and "first stage at 128x128 px" in message
    assert "16 MiB per activation tensor per replica (batch 16, 16 channels)" in message  # 16*128*128*16*4 B
    assert fix == "set model.stem_stride=auto (stride 4 here)"
    auto = config.load(None, ["task=image_classification", "data.image_size=128"], registry=tasks)
    assert stem.first_stage_activations(auto, target, None)[0] == "pass"
    # The rule runs in `make doctor`, on the shards' image size (16 px here).
    assert check(data_dir, tmp_path=tmp_path)["model.first_stage_activations"].status == engine.PASS


def test_the_pixel_baseline_averages_8x8_blocks():
    """A 32 px image of four quadrants: each 8x8 cell is one 4x4 block's mean, scaled to [0, 1]."""
    image = np.zeros((1, 32, 32, 3), np.uint8)
    image[0, :16, 16:] = 255
    image[0, 16:, :16, 0] = 51
    cells = pixels_8x8(image).reshape(8, 8, 3)
    assert cells[:4, 4:].min() == cells[:4, 4:].max() == 1.0
    assert np.allclose(cells[4:, :4, 0], 0.2) and cells[4:, :4, 1:].max() == 0.0 and cells[:4, :4].max() == 0.0
    # A float image in [0, 1] keeps its scale; a smaller image than 8 px is used whole.
    assert pixels_8x8(image.astype(np.float32) / 255).max() == 1.0
    assert pixels_8x8(np.ones((2, 4, 4, 3), np.uint8) * 255).shape == (2, 4 * 4 * 3)


def test_the_baselines_are_the_majority_class_and_a_linear_model_of_the_pixels():
    """Bright images are class 1, dark ones class 0, whatever the noise: the linear model separates
    them; the majority class (0, 6 of 10 train images) scores its share of the eval split."""
    rng = np.random.default_rng(0)

    def images(labels):
        base = np.where(np.array(labels)[:, None, None, None] == 1, 200, 40)
        noise = rng.integers(-30, 30, size=(len(labels), 16, 16, 3))
        return (base + noise).astype(np.uint8), np.array(labels, np.int32)

    train = [images([0, 0, 1, 0, 1]), images([0, 1, 0, 0, 1])]
    evaluation = [images([1, 1, 0, 1])]
    found = TASK.score_baselines(iter(train), iter(evaluation), {"num_classes": 2})
    assert found == {"majority": 0.25, "linear-8x8-pixels": 1.0}
