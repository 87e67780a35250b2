"""The language model's own promises, beyond the shared contract (test_contract.py): packing keeps
every token exactly once, attention is causal and never crosses a packed document, the export
scores as the trained model does, greedy generation is deterministic, and the objective and the
unigram baseline are token-weighted as documented."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from conftest import finished_run_of, selected, task_sample
from {{ cookiecutter.package }}.core import config, input_pipeline
from {{ cookiecutter.package }} import predict, tasks
from {{ cookiecutter.package }}.core import preprocessing
from {{ cookiecutter.package }}.core.keras import keras
from {{ cookiecutter.package }}.core.task import RawExample
from {{ cookiecutter.package }}.tasks.language_model import TASK, generate, packing
from {{ cookiecutter.package }}.tasks.language_model.config import LanguageModelConfig
from {{ cookiecutter.package }}.tasks.language_model.model import build_model
from {{ cookiecutter.package }}.tasks.language_model.objective import TokenMetric, unigram_perplexity
from {{ cookiecutter.package }}.tasks.text import tokenizer

NAME = "language_model"


@pytest.fixture
def lm():
    with selected(NAME) as task:
        yield task


@pytest.fixture
def sample(lm, tmp_path_factory):
    return task_sample(NAME, tmp_path_factory)


def windows_of(data, manifest, split):
    files, _ = input_pipeline.split_files(str(data), manifest, split)
    return [packing.columns_of(record.numpy()) for record in tf.data.TFRecordDataset(files)]


def documents_by_split(raw, manifest, data):
    """Each split's documents as token lists (with the end-of-document id), tokenized directly."""
    model_bytes = (data / manifest["tokenizer"]["file"]).read_bytes()
    listing = TASK.list_raw(str(raw))
    documents = {"train": Counter(), "eval": Counter()}
    for unit in listing.units:
        for item in TASK.read_raw(unit, (raw / unit).read_bytes()):
            if isinstance(item, RawExample):
                split = preprocessing.split_of(item.source, manifest["eval_fraction"])
                documents[split][(*tokenizer.tokenize(model_bytes, item.payload), tokenizer.EOS_ID)] += 1
    return documents


def test_packing_loses_and_duplicates_no_token(sample):
    raw, data = sample
    manifest = json.loads((data / "manifest.json").read_text())
    expected = documents_by_split(raw, manifest, data)
    seq_len = manifest["seq_len"]
    for split in ("train", "eval"):
        found = Counter()
        files, _ = input_pipeline.split_files(str(data), manifest, split)
        for path in files:
            windows = [packing.columns_of(record.numpy()) for record in tf.data.TFRecordDataset(path)]
            assert all(len(column) == seq_len for window in windows for column in window.values())
            stream = []
            for window in windows:
                real = [index for index, segment in enumerate(window["segment_ids"]) if segment]
                assert real == list(range(len(real)))  # padding only at the end
                inputs = [window["inputs"][index] for index in real]
                # each target is the next token of the stream: the next input, or the first of the next window
                assert [window["targets"][index] for index in real[:-1]] == inputs[1:]
                if stream:
                    assert stream[-1] == inputs[0]
                    stream.pop()
                stream += inputs + [window["targets"][real[-1]]]
            documents, current = [], []
            for token in stream:
                current.append(token)
                if token == tokenizer.EOS_ID:
                    documents.append(tuple(current))
                    current = []
            assert current == []
            found.update(documents)
        assert found == expected[split], split
        packed = manifest["packing"][split]
        assert packed["documents"] == sum(expected[split].values())
        assert packed["tokens"] == sum(len(document) for document in expected[split].elements()) - len(files)
        assert packed["windows"] == manifest["splits"][split]["num_examples"]


def test_segments_and_positions_restart_at_each_document():
    stream = [5, 6, tokenizer.EOS_ID, 7, tokenizer.EOS_ID, 8, 9, 10, tokenizer.EOS_ID]
    first, second = packing.pack_stream(stream, 6)
    assert first == {
        "inputs": [5, 6, 2, 7, 2, 8],
        "targets": [6, 2, 7, 2, 8, 9],
        "segment_ids": [1, 1, 1, 2, 2, 3],
        "positions": [0, 1, 2, 0, 1, 0],
    }
    # the third document continues in the next window, where it is that window's first segment
    assert second == {
        "inputs": [9, 10, 0, 0, 0, 0],
        "targets": [10, 2, 0, 0, 0, 0],
        "segment_ids": [1, 1, 0, 0, 0, 0],
        "positions": [0, 1, 0, 0, 0, 0],
    }


SEQ_LEN, VOCAB = 16, 40


@pytest.fixture(scope="module")
def tiny_model():
    """Built in float32 whatever an earlier test on this worker left as Keras' global policy (a run
    in bfloat16 would change the logits the tolerances below compare)."""
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        keras.utils.set_random_seed(0)
        config = LanguageModelConfig(width=32, depth=2, heads=2, mlp_width=64, dropout=0.0)
        return build_model(config, SEQ_LEN, VOCAB)
    finally:
        keras.mixed_precision.set_global_policy(policy)


def logits_of(model, inputs, segment_ids, positions):
    features = {
        "inputs": tf.constant([inputs], tf.int32),
        "segment_ids": tf.constant([segment_ids], tf.int32),
        "positions": tf.constant([positions], tf.int32),
    }
    return model(features, training=False).numpy()[0]


def test_a_later_token_leaves_earlier_logits_unchanged(tiny_model):
    rng = np.random.default_rng(0)
    inputs = rng.integers(3, VOCAB, SEQ_LEN).tolist()
    ones, positions = [1] * SEQ_LEN, list(range(SEQ_LEN))
    before = logits_of(tiny_model, inputs, ones, positions)
    changed = [*inputs[:10], *((np.array(inputs[10:]) + 1 - 3) % (VOCAB - 3) + 3).tolist()]
    after = logits_of(tiny_model, changed, ones, positions)
    np.testing.assert_allclose(after[:10], before[:10], rtol=1e-5, atol=1e-5)
    assert not np.allclose(after[10:], before[10:], atol=1e-3)  # the later positions do see the change


def test_one_packed_document_leaves_another_unchanged(tiny_model):
    rng = np.random.default_rng(1)
    inputs = rng.integers(3, VOCAB, SEQ_LEN).tolist()
    segment_ids = [1] * 6 + [2] * 10
    positions = list(range(6)) + list(range(10))
    before = logits_of(tiny_model, inputs, segment_ids, positions)
    # the first document changed: the second one's logits stay
    first_changed = [(token + 5 - 3) % (VOCAB - 3) + 3 for token in inputs[:6]] + inputs[6:]
    after = logits_of(tiny_model, first_changed, segment_ids, positions)
    np.testing.assert_allclose(after[6:], before[6:], rtol=1e-5, atol=1e-5)
    assert not np.allclose(after[:6], before[:6], atol=1e-3)
    # alone in its window, the second document scores exactly as it did packed behind the first
    alone = logits_of(tiny_model, inputs[6:] + [0] * 6, [1] * 10 + [0] * 6, list(range(10)) + [0] * 6)
    np.testing.assert_allclose(alone[:10], before[6:], rtol=1e-4, atol=1e-4)


def test_perplexity_and_accuracy_count_real_targets_of_weighted_windows():
    logits = np.zeros((2, 3, 4), np.float32)
    logits[0, :, 1] = 5.0  # the first window's model is confident of token 1
    targets = np.array([[1, 1, 0], [3, 2, 1]], np.int32)  # the first window's last position has no target
    perplexity, accuracy = TokenMetric("perplexity"), TokenMetric("accuracy")
    for metric in (perplexity, accuracy):
        metric.update_state(targets, logits, sample_weight=np.array([1.0, 0.0]))  # the second window is padding
    xent = -math.log(math.exp(5.0) / (math.exp(5.0) + 3))
    assert perplexity.result().numpy() == pytest.approx(math.exp(xent), rel=1e-5)
    assert accuracy.result().numpy() == pytest.approx(1.0)
    uniform = TokenMetric("perplexity")
    uniform.update_state(targets, np.zeros((2, 3, 4), np.float32))
    assert uniform.result().numpy() == pytest.approx(4.0, rel=1e-5)  # uniform over 4 tokens


def test_unigram_perplexity_is_add_one_smoothed_on_the_train_counts():
    # p(3) = (1 + 1) / (4 + 4) = 1/4 on the train counts: perplexity 4 on an eval split of 3s only
    assert unigram_perplexity({3: 1, 4: 3}, {3: 2}, vocab_size=4) == pytest.approx(4.0)
    # a token unseen in train still has a probability: 1 / (4 + 4)
    assert unigram_perplexity({3: 1, 4: 3}, {5: 1}, vocab_size=4) == pytest.approx(8.0)


def test_the_manifest_reports_the_unigram_baseline_of_the_eval_split(sample):
    raw, data = sample
    manifest = json.loads((data / "manifest.json").read_text())
    counts = {}
    for split in ("train", "eval"):
        counts[split] = Counter(
            token for window in windows_of(data, manifest, split) for token in window["targets"] if token
        )
    expected = unigram_perplexity(counts["train"], counts["eval"], manifest["vocab_size"])
    assert manifest["unigram_perplexity"] == pytest.approx(expected, rel=1e-4)
    assert 1 < manifest["unigram_perplexity"] < manifest["vocab_size"] + 1


@pytest.fixture
def lm_run(lm, tmp_path_factory):
    return finished_run_of(NAME, tmp_path_factory)


def test_the_export_scores_as_the_trained_model(lm_run, sample, tmp_path):
    cfg, output, _, _ = lm_run
    _, data = sample
    manifest = json.loads((data / "manifest.json").read_text())
    serve, _, _ = predict.load_export(str(output))
    from {{ cookiecutter.package }}.core import model as model_lib
    from {{ cookiecutter.package }}.core import precision

    precision.set_policy("bfloat16")
    model = model_lib.build_model(cfg, manifest)
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(str(output / "checkpoints"))).expect_partial()
    windows = windows_of(data, manifest, "eval")[:4]
    seq_len = manifest["seq_len"]
    ids, lengths, expected = [], [], []
    for window in windows:
        length = window["segment_ids"].count(1)
        prompt, _ = generate.prompt_window(window["inputs"][:length], seq_len)
        ids.append(prompt)
        lengths.append(length)
        features = {name: tf.constant([window[name]], tf.int32) for name in ("inputs", "segment_ids", "positions")}
        logits = tf.cast(model(features, training=False)[0], tf.float32)
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.constant(window["targets"]), logits=logits)
        expected.append(-float(tf.reduce_sum(xent[: length - 1])))
    served = serve(ids=tf.constant(ids, tf.int32), lengths=tf.constant(lengths, tf.int32))
    np.testing.assert_allclose(served["prompt_log_likelihood"].numpy(), expected, rtol=2e-2, atol=0.05)
    assert served["tokens"].shape == (len(windows), cfg.predict.max_new_tokens)


def test_greedy_generation_is_deterministic(lm_run, sample, tmp_path):
    _, output, _, _ = lm_run
    raw, _ = sample
    inputs = TASK.testing().predict_inputs(raw, tmp_path)
    first = predict.predict(str(output), inputs)
    assert predict.predict(str(output), inputs) == first
    assert len(first) == 2 and all(isinstance(fields["continuation"], str) for _, fields in first)
    assert tasks.current().name == NAME


def test_a_window_needs_two_tokens(lm):
    """The shared text keys' rules, with the language model's own shortest window."""
    with pytest.raises(config.ConfigError) as raised:
        config.load(None, ["data.seq_len=1"])
    assert str(raised.value) == "data.seq_len must be at least 2, got 1"
    assert config.load(None, ["data.seq_len=2"]).data.seq_len == 2


def test_a_prompt_longer_than_the_window_keeps_its_end():
    window, length = generate.prompt_window(list(range(3, 40)), 8)
    assert (window, length) == (list(range(32, 40)), 8)
    assert generate.prompt_window([], 4) == ([tokenizer.EOS_ID, 0, 0, 0], 1)


def test_doctor_checks_the_window_on_the_tile_grid_and_the_packing():
    from types import SimpleNamespace

    from {{ cookiecutter.package }}.tasks.language_model.task import packing_rule

    rules = dict(TASK.doctor_rules())
    tpu = SimpleNamespace(kind="tpu")
    cfg = SimpleNamespace(data=SimpleNamespace(seq_len=200, vocab_size=1000))
    assert rules["data.seq_len_tiles"](cfg, tpu, None)[0] == "warn"
    assert rules["model.embedding_rows"](cfg, tpu, {"vocab_size": 900})[0] == "pass"

    def packed(share):
        split = {"documents": 10, "windows": 4, "tokens": 500, "padding_share": share}
        return {"seq_len": 128, "packing": {"train": split, "eval": split}}

    assert packing_rule(cfg, tpu, None)[0] == "skip"
    status, message, _ = packing_rule(cfg, tpu, packed(0.02))
    assert status == "pass" and "2.0% padding" in message
    status, _, fix = packing_rule(cfg, tpu, packed(0.3))
    assert status == "warn" and "--num_shards" in fix
