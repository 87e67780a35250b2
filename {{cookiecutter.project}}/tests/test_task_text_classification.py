"""The text task on its own: raw texts -> rejections, tokenizer, records, model, serving, doctor rules.

Everything runs in-process on small generated data (no Beam job, no distribution strategy), so a
failure here points at the task's code and not at the shared machinery.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core import config
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.core.task import RawExample, RawRejection, Rejected
from {{ cookiecutter.package }}.tasks.text_classification import TASK, doctor_rules, sample_data, tokenizer
from {{ cookiecutter.package }}.tasks.text_classification.config import ClassifierDataConfig, ClassifierModelConfig

SEQ_LEN = 16


def read_all(root: Path) -> tuple[list[RawExample], list[RawRejection]]:
    """What preprocessing reads from `root`: every listed unit through `read_raw`."""
    examples, rejections = [], []
    for unit in TASK.list_raw(str(root)).units:
        for item in TASK.read_raw(unit, (root / unit).read_bytes()):
            (examples if isinstance(item, RawExample) else rejections).append(item)
    return examples, rejections


def is_eval(source: str) -> bool:
    """A stable ~25% held-out split by source, like preprocessing's hash split."""
    return hashlib.sha256(source.encode("utf-8")).digest()[0] < 64


@pytest.fixture(scope="module")
def small_raw(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("text_raw")
    TASK.write_sample_data(root, seed=0, small=True)
    return root


@pytest.fixture(scope="module")
def fitted(small_raw) -> tuple[ClassifierDataConfig, dict, list[RawExample], list[str]]:
    """(data config, artifacts, examples, label names) after fitting the tokenizer on the small sample."""
    data_config = ClassifierDataConfig(seq_len=SEQ_LEN, vocab_size=1000)
    examples, _ = read_all(small_raw)
    artifacts = TASK.fit_encoding([example.payload for example in examples], data_config, str(small_raw))
    return data_config, artifacts, examples, sorted({example.target for example in examples})


def manifest_for(data_config: ClassifierDataConfig, artifacts: dict, num_classes: int = 5) -> dict:
    names = [f"topic{index}" for index in range(num_classes)]
    return TASK.manifest_fields({}, data_config, artifacts, {"label": names})


@pytest.fixture
def bfloat16_policy():
    from {{ cookiecutter.package }}.core.keras import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy(previous)


# ----------------------------------------------------------------------------- raw input


def test_sample_data_is_listed_read_and_rejected_by_reason(small_raw):
    listing = TASK.list_raw(str(small_raw))
    assert "README.txt" not in listing.units and listing.ignored == 1  # no label folder: ignored
    assert "extra.jsonl" in listing.units and listing.units == sorted(listing.units)
    examples, rejections = read_all(small_raw)
    assert Counter(r.reason for r in rejections) == {"empty": 1, "not_utf8": 1, "not_json": 1, "missing_field": 1}
    assert set(Counter(r.reason for r in rejections)) == set(TASK.reject_reasons)
    assert len(examples) == 5 * 50 + 50
    assert {example.target for example in examples} == set(sample_data.TOPICS)
    assert all(example.payload.strip() for example in examples)


def test_the_small_sample_is_clearer_than_the_full_one(small_raw, tmp_path):
    """--small texts are more on topic, so that a short run learns them: the nouns and adjectives
    that belong to one topic only name the text's own topic more often than in the full sample."""
    topics_per_word = Counter(
        word for topic in sample_data.TOPICS.values() for kind in ("nouns", "adjectives") for word in topic[kind]
    )
    topic_of = {
        word: name
        for name, topic in sample_data.TOPICS.items()
        for kind in ("nouns", "adjectives")
        for word in topic[kind]
        if topics_per_word[word] == 1
    }

    def on_topic_share(root: Path) -> float:
        counts = Counter()
        for path in root.glob("*/*.txt"):
            for word in path.read_text(encoding="utf-8", errors="replace").lower().split():
                if (topic := topic_of.get(word.strip(".,?"))) is not None:
                    counts[topic == path.parent.name] += 1
        return counts[True] / (counts[True] + counts[False])

    TASK.write_sample_data(tmp_path, seed=0, small=False)
    full, small = on_topic_share(tmp_path), on_topic_share(small_raw)
    assert small > full + 0.15 and small > 0.85, (small, full)


def test_sample_data_is_deterministic(tmp_path):
    for name in ("a", "b"):
        sample_data.write_dataset(tmp_path / name, texts_per_class=3, jsonl_lines=4, seed=7)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files and all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)


def test_read_raw_text_files():
    assert list(TASK.read_raw("news/1.txt", "\ufeffA text.\n".encode("utf-8"))) == [
        RawExample("news/1.txt", "news", "A text.\n")
    ]  # the byte-order mark is not text
    [empty] = TASK.read_raw("news/2.txt", b" \n\t")
    [latin1] = TASK.read_raw("news/3.txt", "café".encode("latin-1"))
    assert (empty.source, empty.reason) == ("news/2.txt", "empty")
    assert (latin1.source, latin1.reason) == ("news/3.txt", "not_utf8")


def test_read_raw_json_lines_by_line():
    lines = [
        json.dumps({"text": "a fine text", "label": "ok", "id": 7}),
        "",  # skipped, but still counted for the line numbers
        "{not json",
        json.dumps(["a list", "ok"]),
        json.dumps({"text": "no label"}),
        json.dumps({"text": "a number label", "label": 3}),
        json.dumps({"text": "   ", "label": "ok"}),
    ]
    raw_bytes = ("\n".join(lines) + "\n").encode("utf-8") + b'{"text": "caf\xe9", "label": "ok"}\n'
    items = list(TASK.read_raw("more.jsonl", raw_bytes))
    assert items[0] == RawExample("more.jsonl:1", "ok", "a fine text")
    assert [(item.source, item.reason) for item in items[1:]] == [
        ("more.jsonl:3", "not_json"),
        ("more.jsonl:4", "not_json"),
        ("more.jsonl:5", "missing_field"),
        ("more.jsonl:6", "missing_field"),
        ("more.jsonl:7", "empty"),
        ("more.jsonl:8", "not_utf8"),
    ]


def test_list_raw_without_texts_says_what_to_do(tmp_path):
    (tmp_path / "notes.txt").write_text("a top-level text has no label")
    with pytest.raises(UserError, match="make data"):
        TASK.list_raw(str(tmp_path))


# ----------------------------------------------------------------------------- tokenizer and records


def test_tokenizer_fit_is_deterministic(fitted):
    data_config, artifacts, examples, _ = fitted
    texts = [example.payload for example in examples]
    again = TASK.fit_encoding(list(reversed(texts)), data_config, "unused")  # order must not matter
    assert again[tokenizer.MODEL_FILE] == artifacts[tokenizer.MODEL_FILE]
    manifest = manifest_for(data_config, artifacts)
    assert 0 < manifest["vocab_size"] <= data_config.vocab_size
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(artifacts[tokenizer.MODEL_FILE]).hexdigest()
    pieces = tokenizer.processor(artifacts[tokenizer.MODEL_FILE])
    assert (pieces.IdToPiece(0), pieces.unk_id(), pieces.bos_id(), pieces.eos_id()) == ("<pad>", 1, -1, -1)
    with pytest.raises(UserError, match="raise data.vocab_size"):  # fewer pieces than distinct characters
        TASK.fit_encoding(texts, ClassifierDataConfig(vocab_size=10), "unused")


def test_encode_parse_round_trip_pads_and_truncates(fitted):
    import tensorflow as tf

    data_config, artifacts, _, _ = fitted
    short = RawExample("a/1.txt", "a", "The chef baked bread.")
    long = RawExample("b/2.txt", "b", "The team scored a goal after halftime. " * 10)
    vocabularies = {"label": ["x", "b", "y", "a"]}
    records, stats = zip(*(TASK.encode(example, data_config, vocabularies, artifacts) for example in (short, long)))
    full_long = tokenizer.tokenize(artifacts[tokenizer.MODEL_FILE], long.payload)
    full_short = tokenizer.tokenize(artifacts[tokenizer.MODEL_FILE], short.payload)
    assert len(full_long) > SEQ_LEN > len(full_short) > 0
    assert stats[0] == {
        "examples": 1,
        "tokens": len(full_short),
        "truncated": 0,
        "kept_tokens": len(full_short),
        "kept_share": 1.0,
    }
    assert stats[1] == {
        "examples": 1,
        "tokens": len(full_long),
        "truncated": 1,
        "kept_tokens": SEQ_LEN,
        "kept_share": SEQ_LEN / len(full_long),
    }

    padding = TASK.padding_record(manifest_for(data_config, artifacts))
    ids, labels = TASK.parse_batch(tf.constant([*records, padding]), manifest_for(data_config, artifacts))
    assert ids.shape == (3, SEQ_LEN) and ids.dtype == tf.int32 and labels.dtype == tf.int32  # static shape
    ids = ids.numpy()
    assert ids[0, : len(full_short)].tolist() == full_short and not ids[0, len(full_short) :].any()  # pad id 0
    assert ids[1].tolist() == full_long[:SEQ_LEN]
    assert ids[2].tolist() == [tokenizer.UNK_ID] + [0] * (SEQ_LEN - 1)
    assert labels.numpy().tolist() == [3, 1, 0]


def test_encode_rejects_text_without_tokens(fitted):
    data_config, artifacts, _, _ = fitted
    with pytest.raises(Rejected) as raised:
        # A zero-width space only.
        TASK.encode(RawExample("a/1.txt", "a", "\u200b"), data_config, {"label": ["a"]}, artifacts)
    assert raised.value.reason == "empty"


def test_manifest_length_statistics(fitted):
    data_config, artifacts, _, _ = fitted
    # Texts of 8, 12, 20 and 40 pieces in windows of 16: the last two cut to 16 of 20 and 16 of 40.
    stats = {"examples": 4, "tokens": 80, "truncated": 2, "kept_tokens": 52, "kept_share": 1 + 1 + 0.8 + 0.4}
    fields = TASK.manifest_fields(stats, data_config, artifacts, {"label": ["a", "b"]})
    assert (fields["label_names"], fields["num_classes"]) == (["a", "b"], 2)
    assert fields["seq_len"] == SEQ_LEN and fields["tokenizer"]["file"] == tokenizer.MODEL_FILE
    assert fields["truncation"] == "head"
    # 12 of 64 positions are padding; each text keeps 1, 1, 0.8 and 0.4 of its pieces: 0.8 on average.
    assert fields["length_stats"] == {
        "mean_tokens": 20.0,
        "share_truncated": 0.5,
        "mean_kept": 0.8,
        "mean_padding": 0.1875,
    }


def test_the_window_coverage_is_counted_text_by_text(fitted):
    """The statistics encode adds up, for texts of known lengths, against a count by hand: a text of
    n > 16 pieces keeps 16 / n of them, a shorter one all; the manifest's mean and share, and the line
    training and the doctor print."""
    data_config, artifacts, _, _ = fitted
    model_bytes = artifacts[tokenizer.MODEL_FILE]
    texts = ["The chef baked bread.", "The team scored a goal after halftime. " * 3, "A long day of rain. " * 12]
    lengths = [len(tokenizer.tokenize(model_bytes, text)) for text in texts]
    assert lengths[0] <= SEQ_LEN < lengths[1] < lengths[2]
    total = {}
    for index, text in enumerate(texts):
        _, stats = TASK.encode(RawExample(f"a/{index}.txt", "a", text), data_config, {"label": ["a"]}, artifacts)
        total = {key: total.get(key, 0) + value for key, value in stats.items()}
    fields = TASK.manifest_fields(total, data_config, artifacts, {"label": ["a"]})
    kept = (1 + SEQ_LEN / lengths[1] + SEQ_LEN / lengths[2]) / 3
    assert fields["length_stats"]["share_truncated"] == round(2 / 3, 4)
    assert fields["length_stats"]["mean_kept"] == round(kept, 4)
    described = TASK.describe_data({**fields, "num_classes": 1})
    assert f"the window (first {SEQ_LEN} pieces) keeps {kept:.0%} of a text's pieces on average" in described
    assert "67% of texts truncated" in described


# ----------------------------------------------------------------------------- input side


def test_check_manifest_refuses_mismatched_shards(fitted, tmp_path):
    data_config, artifacts, _, _ = fitted
    manifest = manifest_for(data_config, artifacts)
    with pytest.raises(UserError, match="tokenizer .* is missing"):
        TASK.check_manifest(manifest, data_config, str(tmp_path))
    (tmp_path / tokenizer.MODEL_FILE).write_bytes(artifacts[tokenizer.MODEL_FILE])
    TASK.check_manifest(manifest, data_config, str(tmp_path))  # matching shards pass
    with pytest.raises(UserError, match="data.seq_len=16"):
        TASK.check_manifest(manifest, ClassifierDataConfig(seq_len=32, vocab_size=1000), str(tmp_path))
    (tmp_path / tokenizer.MODEL_FILE).write_bytes(artifacts[tokenizer.MODEL_FILE] + b"x")
    with pytest.raises(UserError, match="shards and tokenizer do not match"):
        TASK.check_manifest(manifest, data_config, str(tmp_path))


def test_synthetic_batch_is_shaped_like_a_parsed_batch(fitted):
    data_config, artifacts, _, _ = fitted
    manifest = manifest_for(data_config, artifacts)
    ids, labels = TASK.synthetic_batch(8, manifest)
    assert ids.shape == (8, SEQ_LEN) and ids.dtype.name == "int32" and labels.shape == (8,)
    assert ids.numpy().min() >= 2 and ids.numpy().max() < manifest["vocab_size"]


# ----------------------------------------------------------------------------- model and serving


def test_model_gives_float32_logits_under_mixed_bfloat16(fitted, bfloat16_policy):
    import tensorflow as tf

    data_config, artifacts, _, _ = fitted
    manifest = manifest_for(data_config, artifacts)
    model = TASK.build_model(ClassifierModelConfig(width=32, depth=1, heads=2, mlp_width=64), manifest)
    assert model.name == "transformer" and model.input_names == ["ids"]
    assert model.get_layer("token_embedding").input_dim % 128 == 0
    ids, _ = TASK.synthetic_batch(4, manifest)
    ids = tf.concat([ids[:, :3], tf.zeros([4, SEQ_LEN - 3], tf.int32)], axis=1)  # mostly padding
    logits = model(ids, training=False)
    assert logits.dtype == tf.float32 and logits.shape == (4, 5)
    assert np.isfinite(logits.numpy()).all()
    outputs = TASK.build_serving_signature(model, TASK.predict_config(), TASK.objective_config(), manifest)(ids)
    assert outputs["class"].dtype == tf.int32 and outputs["class"].shape == (4,)
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    "override, line",
    [
        ("data.seq_len=0", "data.seq_len must be at least 1, got 0"),
        ("data.vocab_size=4", "data.vocab_size must be at least 8, got 4"),
        ("data.tokenizer_sample=0", "data.tokenizer_sample must be at least 1, got 0"),
    ],
)
def test_text_data_keys_out_of_range_are_one_line_when_the_config_loads(override, line):
    """Refused before any data is read, by the config the text tasks share."""
    with pytest.raises(config.ConfigError) as raised:
        config.load(None, [f"task={TASK.name}", override], registry=tasks)
    assert str(raised.value) == line


def test_model_refuses_width_not_divisible_by_heads(fitted):
    data_config, artifacts, _, _ = fitted
    with pytest.raises(UserError, match="model.heads"):
        TASK.build_model(ClassifierModelConfig(width=30, heads=4), manifest_for(data_config, artifacts))


def test_predict_inputs_tokenizes_each_line(fitted, tmp_path):
    data_config, artifacts, _, _ = fitted
    manifest = manifest_for(data_config, artifacts)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / tokenizer.MODEL_FILE).write_bytes(artifacts[tokenizer.MODEL_FILE])
    export = tmp_path / "export"
    (export / "assets.extra").mkdir(parents=True)
    for name, content in TASK.export_assets(manifest, str(tmp_path / "data")).items():
        (export / "assets.extra" / name).write_bytes(content)
    texts = tmp_path / "texts.txt"
    long_line = "The team scored a goal after halftime. " * 3
    texts.write_text(f"The chef baked bread.\n\n  \n{long_line}\n")
    names, ids = TASK.predict_inputs([str(texts)], manifest, str(export))
    assert names == ["texts.txt:1 The chef baked bread.", f"texts.txt:4 {long_line[:40]}"]
    assert ids.shape == (len(names), SEQ_LEN) and ids.dtype == np.int32
    assert ids[0].tolist()[:4] == tokenizer.tokenize(artifacts[tokenizer.MODEL_FILE], "The chef baked bread.")[:4]
    with pytest.raises(UserError, match="does not exist"):
        TASK.predict_inputs([str(tmp_path / "missing.txt")], manifest, str(export))
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(UserError, match="no text"):
        TASK.predict_inputs([str(tmp_path / "blank.txt")], manifest, str(export))


@pytest.mark.slow
def test_sample_data_is_learnable(tmp_path):
    """Plain Keras fit on sample texts encoded by the task's own code: a few hundred steps must
    reach well above chance (0.2 for five topics) on texts it never saw. The topics overlap by
    design, so a bag-of-words Bayes classifier tops out near 0.9 on this much data."""
    import tensorflow as tf

    from {{ cookiecutter.package }}.core.keras import keras

    sample_data.write_dataset(tmp_path, texts_per_class=300, jsonl_lines=0, seed=1)
    examples, _ = read_all(tmp_path)
    labels = sorted({example.target for example in examples})
    data_config = ClassifierDataConfig(seq_len=64)
    train = [example for example in examples if not is_eval(example.source)]
    held_out = [example for example in examples if is_eval(example.source)]
    artifacts = TASK.fit_encoding([example.payload for example in train], data_config, str(tmp_path))
    manifest = manifest_for(data_config, artifacts, len(labels))

    def batch(subset):
        return TASK.parse_batch(
            tf.constant([TASK.encode(example, data_config, {"label": labels}, artifacts)[0] for example in subset]),
            manifest,
        )

    keras.utils.set_random_seed(0)
    steps = 200
    model = TASK.build_model(ClassifierModelConfig(), manifest)
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps, warmup_target=2e-3, warmup_steps=steps // 10)
    model.compile(
        keras.optimizers.AdamW(schedule, weight_decay=0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=10,
    )
    train_ids, train_labels = batch(train)
    dataset = tf.data.Dataset.from_tensor_slices((train_ids, train_labels)).shuffle(2048, seed=0).repeat()
    model.fit(dataset.batch(32, drop_remainder=True), steps_per_epoch=steps, epochs=1, verbose=0)
    held_ids, held_labels = batch(held_out)
    _, accuracy = model.evaluate(held_ids, held_labels, verbose=0)
    assert len(held_out) > 300 and accuracy >= 0.8, accuracy


# ----------------------------------------------------------------------------- doctor rules


def test_doctor_rules():
    tpu, cpu = SimpleNamespace(kind="tpu"), SimpleNamespace(kind="cpu")

    def cfg(**data):
        return SimpleNamespace(data=ClassifierDataConfig(**data))

    def stats(truncated, padding):
        return {
            "seq_len": 128,
            "length_stats": {"mean_tokens": 40.0, "share_truncated": truncated, "mean_padding": padding},
        }

    assert [name for name, _ in TASK.doctor_rules()] == [name for name, _ in doctor_rules.rules()]
    assert doctor_rules.seq_len_tiles(cfg(seq_len=256), tpu, None)[0] == "pass"
    assert doctor_rules.seq_len_tiles(cfg(seq_len=200), tpu, None)[0] == "warn"
    status, _, fix = doctor_rules.seq_len_tiles(cfg(seq_len=100), tpu, None)
    assert status == "fail" and "data.seq_len=128" in fix
    assert doctor_rules.seq_len_tiles(cfg(seq_len=100), None, None)[0] == "skip"
    assert doctor_rules.embedding_rows(cfg(), tpu, {"vocab_size": 1999})[0] == "pass"
    assert doctor_rules.embedding_rows(cfg(vocab_size=500), tpu, {"vocab_size": 1999})[0] == "warn"
    assert doctor_rules.sequence_fit(cfg(), tpu, stats(0.05, 0.3))[0] == "pass"
    status, message, fix = doctor_rules.sequence_fit(cfg(), tpu, stats(0.3, 0.3))
    assert status == "warn" and "raise data.seq_len" in fix and "data.truncation=head_tail" in fix
    assert "model.bag_width" in fix and "the baselines read whole texts" in message
    coverage = stats(0.3, 0.3)
    coverage["length_stats"]["mean_kept"] = 0.41
    assert (
        "30% of texts truncated, the window keeps 41% of a text's pieces"
        in doctor_rules.sequence_fit(cfg(), tpu, coverage)[1]
    )
    coverage["truncation"] = "head_tail"
    assert "data.truncation" not in doctor_rules.sequence_fit(cfg(), tpu, coverage)[2]
    status, _, fix = doctor_rules.sequence_fit(cfg(), cpu, stats(0.0, 0.7))
    assert status == "warn" and "data.seq_len=64" in fix
    assert doctor_rules.sequence_fit(cfg(), tpu, stats(0.0, 0.7))[0] == "pass"  # 128 is the TPU's floor
    assert doctor_rules.sequence_fit(cfg(), tpu, None)[0] == "skip"


def test_model_widths_off_the_mxu_tiles_are_named_with_their_fix(data_dir, tmp_path):
    """The shared width rules on the Transformer: on a TPU, widths that are not multiples of 128 are
    padded by the MXU (a warning that names the layers, and the config change that fixes it), and
    the logits layer, whose width the data sets, is never named."""
    from test_doctor import check

    from {{ cookiecutter.package }}.doctor import engine

    narrow = ("model.width=100", "model.heads=1", "model.mlp_width=200")
    rule = check(data_dir, *narrow, tmp_path=tmp_path, target="tpu")["model.feature_dims"]
    assert rule.status == engine.WARN and "100" in rule.message and "200" in rule.message
    assert "logits" not in rule.message and rule.fix == "model.width=128 model.mlp_width=256"
    tiled = ("model.width=128", "model.heads=1", "model.mlp_width=256")
    assert check(data_dir, *tiled, tmp_path=tmp_path, target="tpu")["model.feature_dims"].status == engine.PASS
    assert check(data_dir, *narrow, tmp_path=tmp_path)["model.feature_dims"].status == engine.SKIP  # a CPU run


def test_predict_sees_what_evaluation_sees(raw_dir, data_dir, tmp_path):
    """The token ids predict gives a line of text are the ids the evaluation input gives the same
    text: every eval text of the sample, written one per line, yields exactly the eval split's rows."""
    from collections import Counter

    from {{ cookiecutter.package }}.core import config, input_pipeline
    from {{ cookiecutter.package }}.core import preprocessing

    manifest = json.loads((data_dir / "manifest.json").read_text())
    eval_fraction = config.load(
        None, [f"task={TASK.name}", *TASK.testing().overrides], registry=tasks
    ).data.eval_fraction
    examples, _ = read_all(raw_dir)
    texts = [example.payload for example in examples if preprocessing.split_of(example.source, eval_fraction) == "eval"]
    files, counts = input_pipeline.split_files(str(data_dir), manifest, "eval")
    evaluated = Counter()
    for ids, _, weights in input_pipeline.eval_pipeline(files, counts, TASK, manifest, 8):
        evaluated.update(tuple(row) for row, weight in zip(ids.numpy().tolist(), weights.numpy()) if weight)
    assert sum(evaluated.values()) == manifest["splits"]["eval"]["num_examples"]

    export = tmp_path / "export"
    (export / "assets.extra").mkdir(parents=True)
    for name, content in TASK.export_assets(manifest, str(data_dir)).items():
        (export / "assets.extra" / name).write_bytes(content)
    lines = tmp_path / "eval.txt"
    lines.write_text("".join(" ".join(text.split()) + "\n" for text in texts))
    _, predicted = TASK.predict_inputs([str(lines)], manifest, str(export))
    assert Counter(tuple(row) for row in predicted.tolist()) == evaluated


def _baseline_batches(records: list[bytes], manifest: dict, size: int = 3):
    """What core/baselines.py hands the task: `baseline_batch` of the serialized records, as numpy."""
    import tensorflow as tf

    for start in range(0, len(records), size):
        features, targets = TASK.baseline_batch(tf.constant(records[start : start + size]), manifest)
        yield features.numpy(), targets.numpy()


def test_the_baselines_read_the_whole_text(fitted):
    """Every text opens with the same sentences, longer than the window; only what follows names the
    class. The model's window of each is the same (a model of it can only guess), but the baselines
    read the bag of every piece of the whole text: naive Bayes gets every eval text right."""
    import tensorflow as tf

    data_config, artifacts, _, _ = fitted
    opening = "The match report begins here. The weather was mild and the crowd was large. " * 2
    endings = {"bake": "The chef baked bread and cake.", "goal": "The striker scored a goal."}
    categories = sorted(endings)

    def text(label: str, index: int) -> str:
        return f"{opening}{' '.join([endings[label]] * (1 + index % 3))}"

    def record(label: str, index: int) -> bytes:
        example = RawExample(f"{label}/{index}.txt", label, text(label, index))
        return TASK.encode(example, data_config, {"label": categories}, artifacts)[0]

    train = [record(label, index) for index in range(4) for label in categories]
    evaluation = [record(label, index) for index in (5, 6) for label in categories]
    manifest = manifest_for(data_config, artifacts, len(categories))
    windows, _ = TASK.parse_batch(tf.constant(evaluation), manifest)
    assert all((row == windows.numpy()[0]).all() for row in windows.numpy())  # the signal is past the window
    counts, labels = next(_baseline_batches(evaluation[:1], manifest))
    model_bytes = artifacts[tokenizer.MODEL_FILE]
    whole = tokenizer.tokenize(model_bytes, text("bake", 5))
    assert counts.shape == (1, manifest["vocab_size"]) and counts.sum() == len(whole) and labels.tolist() == [0]
    assert counts[0, whole].tolist() == [whole.count(piece) for piece in whole]
    found = TASK.score_baselines(_baseline_batches(train, manifest), _baseline_batches(evaluation, manifest), manifest)
    assert found == {"majority": 0.5, "bag-of-words": 1.0}


def test_head_tail_keeps_both_ends_in_the_records_and_in_predict(fitted, tmp_path):
    """data.truncation=head_tail: a long text's first seq_len // 2 and last seq_len - seq_len // 2 pieces,
    in the shards and in `make predict`'s batch alike; a short text whole; shards cut one way refuse a
    config that says the other."""
    import dataclasses

    import tensorflow as tf

    assert tokenizer.window(list(range(10)), 4, "head_tail") == [0, 1, 8, 9]
    assert tokenizer.window(list(range(10)), 5, "head_tail") == [0, 1, 7, 8, 9]
    assert tokenizer.window(list(range(10)), 4) == [0, 1, 2, 3]
    assert tokenizer.window([3, 4], 4, "head_tail") == [3, 4]
    data_config, artifacts, _, _ = fitted
    both_ends = dataclasses.replace(data_config, truncation="head_tail")
    text = "The opening line. " + "The team scored a goal after halftime. " * 6 + "Signed, the editor."
    ids = tokenizer.tokenize(artifacts[tokenizer.MODEL_FILE], text)
    half = SEQ_LEN // 2
    record, stats = TASK.encode(RawExample("a/1.txt", "a", text), both_ends, {"label": ["a"]}, artifacts)
    manifest = TASK.manifest_fields(stats, both_ends, artifacts, {"label": ["a"]})
    assert manifest["truncation"] == "head_tail"
    rows, _ = TASK.parse_batch(tf.constant([record]), manifest)
    assert rows.numpy()[0].tolist() == ids[:half] + ids[-half:]
    (tmp_path / "export" / "assets.extra").mkdir(parents=True)
    (tmp_path / "export" / "assets.extra" / tokenizer.MODEL_FILE).write_bytes(artifacts[tokenizer.MODEL_FILE])
    (tmp_path / "texts.txt").write_text(text + "\n")
    _, predicted = TASK.predict_inputs([str(tmp_path / "texts.txt")], manifest, str(tmp_path / "export"))
    assert predicted[0].tolist() == rows.numpy()[0].tolist()
    (tmp_path / tokenizer.MODEL_FILE).write_bytes(artifacts[tokenizer.MODEL_FILE])
    with pytest.raises(UserError, match="data.truncation=head_tail"):
        TASK.check_manifest(manifest, data_config, str(tmp_path))
    assert (
        ClassifierDataConfig(truncation="tail").problem()
        == "data.truncation must be one of head, head_tail, got 'tail'"
    )


@pytest.mark.parametrize("pooling", ["mean", "max", "mean_max"])
def test_pooling_reads_the_real_tokens_only(pooling):
    """The logits are the last layer of the mean, the max or both of the final representations of the
    real tokens: padding changes nothing, whatever its share of the row."""
    import tensorflow as tf

    from {{ cookiecutter.package }}.core.keras import keras
    from {{ cookiecutter.package }}.tasks.text_classification.model import build_model

    settings = ClassifierModelConfig(width=16, depth=1, heads=2, mlp_width=32, dropout=0.0, pooling=pooling)
    model = build_model(settings, seq_len=8, vocab_size=32, num_classes=3)
    ids = np.array([[5, 6, 7, 0, 0, 0, 0, 0], [9, 10, 11, 12, 13, 14, 15, 16]], np.int32)
    tokens = keras.Model(model.inputs, model.get_layer("final_norm").output)(ids).numpy()
    parts = {"mean": [], "max": []}
    for row, length in zip(tokens, (3, 8)):
        parts["mean"].append(row[:length].mean(axis=0))
        parts["max"].append(row[:length].max(axis=0))
    pooled = np.concatenate([np.array(parts[name]) for name in pooling.split("_")], axis=-1)
    dense = model.get_layer("logits")
    expected = pooled @ dense.kernel.numpy() + dense.bias.numpy()
    np.testing.assert_allclose(model(tf.constant(ids)).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_pooling_that_does_not_exist_is_one_line():
    assert ClassifierModelConfig().problem() is None
    problem = ClassifierModelConfig(pooling="sum").problem()
    assert problem == "model.pooling must be one of mean, max, mean_max, got 'sum'"


def test_the_bag_of_pieces_reads_the_pieces_and_their_adjacent_pairs():
    """model.bag_width > 0 joins, to the pooled tokens, the mean over a text's pieces of their
    embeddings plus those of its adjacent pairs, hashed after the pieces' rows; padding and the pair
    that starts a text count nothing, and the order of the pieces matters through the pairs."""
    import tensorflow as tf

    from {{ cookiecutter.package }}.core.keras import keras
    from {{ cookiecutter.package }}.tasks.text.layers import embedding_rows
    from {{ cookiecutter.package }}.tasks.text_classification.model import build_model

    settings = ClassifierModelConfig(width=16, depth=1, heads=2, mlp_width=32, dropout=0.0, bag_width=4, bag_buckets=64)
    model = build_model(settings, seq_len=8, vocab_size=32, num_classes=3)
    rows = embedding_rows(32)
    table = model.get_layer("bag_embedding").embeddings.numpy()
    assert table.shape == (rows + 64, 4)
    texts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16], [7, 6, 5]]
    ids = np.array([text + [0] * (8 - len(text)) for text in texts], np.int32)
    tokens = keras.Model(model.inputs, model.get_layer("final_norm").output)(ids).numpy()
    features = []
    for row, text in zip(tokens, texts):
        pairs = [rows + (previous * rows + current) % 64 for previous, current in zip(text, text[1:])]
        bag = (table[text].sum(axis=0) + table[pairs].sum(axis=0)) / len(text)
        features.append(np.concatenate([row[: len(text)].mean(axis=0), bag]))
    # The same pieces in the reverse order: the same sum of pieces, other pairs.
    assert not np.allclose(features[0][16:], features[2][16:], atol=1e-3)
    dense = model.get_layer("logits")
    expected = np.array(features) @ dense.kernel.numpy() + dense.bias.numpy()
    logits = model(tf.constant(ids)).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    assert ClassifierModelConfig(bag_width=-1).problem() == "model.bag_width must be 0 (off) or more, got -1"


@pytest.mark.parametrize(
    "which, overrides", [("local", ()), ("tpu", ()), ("local", ("model.pooling=mean_max", "model.bag_width=32"))]
)
def test_the_trainers_flops_per_step_are_the_text_classifiers_multiplies_counted_by_hand(which, overrides):
    """What the log's TFLOP/s and MFU divide (utilisation.flops_per_step, which the trainer calls) for
    the text classifier is exactly its matrix multiplies counted by hand, x 3 for the backward pass:
    per token and block the Q, K, V and output projections (8 W^2), the MLP (4 W M) and attention's
    QK^T and AV over the whole window (4 S W); per example the logits of the pooled vector (W for
    mean pooling, 2 W for mean_max, plus the bag's width); over the global batch x 2 steps of
    accumulation. The bag's embeddings are looked up, not multiplied."""
    from conftest import config_file
    from {{ cookiecutter.package }}.core import config, topology, utilisation
    from {{ cookiecutter.package }}.core.model import build_model

    task = tasks.load("text_classification")
    cfg = config.load(
        str(config_file(task.name, which)), ["train.gradient_accumulation_steps=2", *overrides], registry=tasks
    )
    manifest = task.nominal_manifest(cfg.data)
    model = build_model(cfg, task, manifest)
    counted = utilisation.flops_per_step(model, cfg, topology.topology("v5litepod-8"))
    width, seq_len, mlp = cfg.model.width, cfg.data.seq_len, cfg.model.mlp_width
    per_token = cfg.model.depth * (8 * width * width + 4 * width * mlp + 4 * seq_len * width)
    pooled = (2 if cfg.model.pooling == "mean_max" else 1) * width + cfg.model.bag_width
    forward = seq_len * per_token + 2 * pooled * manifest["num_classes"]
    assert counted == pytest.approx(3 * forward * cfg.train.global_batch_size * 2, rel=1e-9)


def test_a_shared_tokenizer_gives_the_pretrainings_ids(raw_dir, tmp_path):
    """data.tokenizer: the classifier's text is encoded with the named tokenizer (here one with an
    end-of-document id, as next-token data has), not one trained on its own split; its ids
    are that tokenizer's."""
    from conftest import config_file, run_preprocess

    texts = [path.read_text(errors="ignore") for path in sorted(raw_dir.rglob("*.txt"))[:200]]
    pretraining = tmp_path / "pretraining.model"
    pretraining.write_bytes(tokenizer.fit(texts, 300, 1000, end_of_document=True))
    manifest = run_preprocess(
        raw_dir, tmp_path / "data", "--config", str(config_file(TASK.name)), f"data.tokenizer={pretraining}"
    )
    assert manifest["tokenizer"]["sha256"] == tokenizer.sha256(pretraining.read_bytes())
    assert manifest["vocab_size"] == tokenizer.vocab_size(pretraining.read_bytes()) != 2000
    assert (tmp_path / "data" / tokenizer.MODEL_FILE).read_bytes() == pretraining.read_bytes()
