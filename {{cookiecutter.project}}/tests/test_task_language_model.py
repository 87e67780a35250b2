"""The language model's own promises, beyond the shared contract (test_contract.py): packing keeps
every token exactly once, in the stable order of the documents' sources; attention is causal and
never crosses a packed document; the export scores as the trained model does and generates what its
`predict:` keys say (greedy: the argmax of the model's logits on the growing window, which shifts
left once full; sampling: within the top k, reproducible by its seed); the objective and the unigram
baseline are token-weighted as documented."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from conftest import config_file, finished_run_of, run_preprocess, task_sample
from {{ cookiecutter.package }}.core import config, input_pipeline
from {{ cookiecutter.package }} import predict, tasks, train
from {{ cookiecutter.package }}.core import preprocessing
from {{ cookiecutter.package }}.core.keras import keras
from {{ cookiecutter.package }}.core.task import RawExample
from {{ cookiecutter.package }}.tasks.language_model import TASK, generate, packing
from {{ cookiecutter.package }}.tasks.language_model.config import LanguageModelConfig, LanguageModelPredictConfig
from {{ cookiecutter.package }}.tasks.language_model.model import build_model
from {{ cookiecutter.package }}.tasks.language_model.objective import TokenMetric
from {{ cookiecutter.package }}.tasks.language_model.task import unigram_perplexity
from {{ cookiecutter.package }}.tasks.text import tokenizer

NAME = "language_model"


@pytest.fixture
def lm():
    return tasks.load(NAME)


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
            found.update(documents_in(stream, whole=True))
        assert found == expected[split], split
        packed = manifest["packing"][split]
        assert packed["documents"] == sum(expected[split].values())
        assert packed["tokens"] == sum(len(document) for document in expected[split].elements()) - len(files)
        assert packed["windows"] == manifest["splits"][split]["num_examples"]


def documents_of_shard(path) -> list[tuple[int, ...]]:
    """A shard's documents (with their end-of-document id), in the order its windows hold them."""
    windows = [packing.columns_of(record.numpy()) for record in tf.data.TFRecordDataset(path)]
    stream = [windows[0]["inputs"][0], *(token for window in windows for token in window["targets"] if token)]
    return documents_in(stream)


def documents_in(stream: list[int], whole: bool = False) -> list[tuple[int, ...]]:
    """The documents of a token stream, each ending with its end-of-document id; `whole`: the stream
    must end with one (no document cut off)."""
    documents, current = [], []
    for token in stream:
        current.append(token)
        if token == tokenizer.EOS_ID:
            documents.append(tuple(current))
            current = []
    assert not (whole and current), current
    return documents


def test_a_shard_packs_its_documents_in_the_stable_order_of_their_sources(sample):
    """The language model's counterpart of test_preprocess's check that a classifier's shard is no
    run of one label: each shard holds the documents whose source hashes to it, in the order of
    their sources' order hash (preprocessing.order_key), not of their sorted paths."""
    raw, data = sample
    manifest = json.loads((data / "manifest.json").read_text())
    model_bytes = (data / manifest["tokenizer"]["file"]).read_bytes()
    tokens_of, sources_of = {}, {"train": [], "eval": []}
    for unit in TASK.list_raw(str(raw)).units:
        for item in TASK.read_raw(unit, (raw / unit).read_bytes()):
            if isinstance(item, RawExample):
                tokens_of[item.source] = (*tokenizer.tokenize(model_bytes, item.payload), tokenizer.EOS_ID)
                sources_of[item.split or preprocessing.split_of(item.source, manifest["eval_fraction"])].append(
                    item.source
                )
    reordered = shards = 0
    for split, sources in sources_of.items():
        files, _ = input_pipeline.split_files(str(data), manifest, split)
        shards += len(files)
        for shard, path in enumerate(files):
            mine = [source for source in sources if preprocessing.shard_of(source, len(files)) == shard]
            expected = [tokens_of[source] for source in sorted(mine, key=preprocessing.order_key)]
            assert documents_of_shard(path) == expected, path
            reordered += expected != [tokens_of[source] for source in sorted(mine)]
    assert reordered == shards  # no shard is in the order of its sorted paths


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
    # train 3 3 4 5 3 over 6 ids: p(3) = 4/11, p(4) = 2/11, p(6) = 1/11; eval 3 4 6:
    # (11/4 * 11/2 * 11/1) ** (1/3) = 11/2
    train, evaluation = Counter([3, 3, 4, 5, 3]), Counter([3, 4, 6])
    assert unigram_perplexity(train, evaluation, vocab_size=6) == pytest.approx(5.5)


def test_the_manifest_reports_the_unigram_baseline_of_the_eval_split(sample):
    """Recomputed from the documents (tokenized here, not read back from the shards or the pack
    statistics) by the formula: p(id) = (its train count + 1) / (train targets + vocabulary), the
    perplexity exp(-mean log p) over the eval targets. A target is every token of a shard's stream
    but its first."""
    raw, data = sample
    manifest = json.loads((data / "manifest.json").read_text())
    documents = documents_by_split(raw, manifest, data)
    counts = {}
    for split in ("train", "eval"):
        counts[split] = Counter(token for document in documents[split].elements() for token in document)
        files, _ = input_pipeline.split_files(str(data), manifest, split)
        for path in files:
            first = next(iter(tf.data.TFRecordDataset(path)))
            counts[split][packing.columns_of(first.numpy())["inputs"][0]] -= 1
    train_total, vocab_size = sum(counts["train"].values()), manifest["vocab_size"]
    assert train_total == manifest["packing"]["train"]["tokens"]
    log_p = [math.log((counts["train"][token] + 1) / (train_total + vocab_size)) for token in counts["eval"].elements()]
    assert len(log_p) == manifest["packing"]["eval"]["tokens"]
    assert manifest["unigram_perplexity"] == pytest.approx(math.exp(-sum(log_p) / len(log_p)), rel=1e-5)
    # The n-gram baselines in both metrics the model reports: perplexity (the headline) and accuracy.
    found = manifest["baselines"]
    assert found["scores"]["unigram"] == pytest.approx(manifest["unigram_perplexity"], abs=1e-4)
    assert set(found["other_metrics"]) == {"accuracy"} and set(found["other_metrics"]["accuracy"]) == {
        "unigram",
        "bigram",
    }
    assert 0 < found["other_metrics"]["accuracy"]["unigram"] < found["other_metrics"]["accuracy"]["bigram"] < 1


def name_in(split: str, stem: str, eval_fraction: float) -> str:
    """A file name `stem`-N.txt that the stable hash of its source sends to `split`."""
    return next(
        name
        for name in (f"{stem}-{index}.txt" for index in range(1000))
        if preprocessing.split_of(name, eval_fraction) == split
    )


def test_a_document_that_dominates_is_flagged_and_can_be_capped(sample, tmp_path, capsys):
    """The sample with a 1 MB document on one line (one sentence repeated) and a copy of one of its
    documents: preprocessing prints each split's largest documents' share of the tokens (the windows
    hold them) and flags the big one with its share and the fix; the manifest's shares and its
    count of exact duplicates are those of the documents tokenized here. With
    data.max_document_windows=4 the document keeps 4 windows' tokens, and nothing is flagged."""
    raw, data = sample
    fraction = json.loads((data / "manifest.json").read_text())["eval_fraction"]
    copy = tmp_path / "raw"
    shutil.copytree(raw, copy)
    big = name_in("train", "big", fraction)
    (copy / big).write_text("the quick brown fox jumps over the lazy dog while the cat sleeps. " * 16_000)
    assert (copy / big).stat().st_size > 2**20
    originals = sorted(path for path in copy.rglob("*.txt") if path.name != big and path.stat().st_size > 100)
    original = next(
        path for path in originals if preprocessing.split_of(str(path.relative_to(copy)), fraction) == "train"
    )
    twin = name_in("train", "twin", fraction)
    shutil.copy(original, copy / twin)

    overrides = [item for item in TASK.testing().overrides if item.startswith("data.")]
    arguments = ["--config", str(config_file(NAME)), "--num_shards", "2", *overrides]
    capsys.readouterr()
    manifest = run_preprocess(copy, tmp_path / "data", *arguments)
    printed = capsys.readouterr().out
    documents = documents_by_split(copy, manifest, tmp_path / "data")
    totals = {split: sum(len(doc) * count for doc, count in documents[split].items()) for split in documents}
    model_bytes = (tmp_path / "data" / manifest["tokenizer"]["file"]).read_bytes()
    big_tokens = len(tokenizer.tokenize(model_bytes, (copy / big).read_text())) + 1
    share = big_tokens / totals["train"]
    assert share > 0.5  # it is most of the train split
    largest = manifest["sizes"]["train"]["largest"]
    assert manifest["sizes"]["statistic"] == "document_tokens"
    assert largest[0]["source"] == str(copy / big) and largest[0]["size"] == big_tokens
    assert largest[0]["share"] == pytest.approx(share, abs=1e-6)
    assert manifest["sizes"]["train"]["total"] == totals["train"]
    assert [entry["size"] for entry in largest] == sorted((entry["size"] for entry in largest), reverse=True)
    assert f"largest train examples by document_tokens: {copy / big} {share:.1%}" in printed
    flagged = [line for line in printed.splitlines() if line.startswith("flagged: ")]
    assert flagged == [
        f"flagged: {copy / big} is {share:.1%} of the train split's document_tokens "
        "(over data.max_example_share=0.05): one example would be that much of what the model trains on; "
        "split it, cap it (data.max_document_windows=N keeps a document's first N windows), or drop it from "
        "the raw data"
    ]
    repeats = {split: sum(count - 1 for count in documents[split].values()) for split in documents}
    assert repeats["train"] >= 1 and manifest["duplicates"] == repeats
    assert f"duplicates: train {repeats['train']}" in printed

    capsys.readouterr()
    capped = run_preprocess(copy, tmp_path / "capped", *arguments, "data.max_document_windows=4")
    printed = capsys.readouterr().out
    seq_len = capped["seq_len"]
    assert capped["sizes"]["train"]["largest"][0]["size"] <= 4 * seq_len + 1
    assert "flagged: " not in printed, printed


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
    model = model_lib.build_model(cfg, TASK, manifest)
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


def logits_before_each(model, prompt, generated, seq_len, vocab_size) -> np.ndarray:
    """float [len(generated), vocab_size]: the model's logits at the last token of the window each
    generated token followed (the last seq_len tokens of the prompt and the tokens generated before
    it), one window at a time as generation runs them; padding and the unknown piece at -inf (never
    chosen). Derived here from generate.py's docstring, not from its code."""
    tokens, rows = list(prompt) or [tokenizer.EOS_ID], []
    for token in generated:
        window = tokens[-seq_len:]
        padding = [0] * (seq_len - len(window))
        logits = np.array(
            logits_of(model, window + padding, [1] * len(window) + padding, list(range(len(window))) + padding)
        )
        row = logits[len(window) - 1, :vocab_size].astype(np.float64)
        row[[tokenizer.PAD_ID, tokenizer.UNK_ID]] = -np.inf
        rows.append(row)
        tokens.append(token)
    return np.array(rows)


def ranks(logits: np.ndarray, generated) -> list[int]:
    """Each generated token's rank among its step's logits (0: the likeliest), ties within 1e-3 (the
    export's graph and a call of its model may round differently) counted in the token's favour."""
    return [int((row > row[token] + 1e-3).sum()) for row, token in zip(logits, generated)]


def served_tokens(serve, prompts, seq_len) -> list[list[int]]:
    ids, lengths = zip(*(generate.prompt_window(prompt, seq_len) for prompt in prompts))
    served = serve(ids=tf.constant(ids, tf.int32), lengths=tf.constant(lengths, tf.int32))
    return served["tokens"].numpy().tolist()


def eval_prompts(data, manifest) -> list[list[int]]:
    """Prompts cut from the eval stream: one token, part of a window, one token short of a full window,
    a full window, and more than a window (generation keeps its end)."""
    seq_len = manifest["seq_len"]
    files, _ = input_pipeline.split_files(str(data), manifest, "eval")
    windows = [packing.columns_of(record.numpy()) for record in tf.data.TFRecordDataset(files[0])]
    stream = [token for window in windows[:2] for token in window["inputs"]]  # both full: a shard's stream
    return [stream[:length] for length in (1, 9, seq_len - 1, seq_len, seq_len + 13)]


def test_greedy_generation_picks_the_argmax_of_the_exported_model(lm_run, sample, tmp_path):
    """Each token the export generates (temperature 0) is the likeliest of the exported model's
    logits after the prompt and the tokens before it, recomputed here one window at a time, also once
    the window is full and shifts left; `predict` prints the text prompts' tokens decoded, up to the
    first end-of-document id."""
    cfg, output, _, _ = lm_run
    raw, data = sample
    serve, manifest, export_dir = predict.load_export(str(output))
    model = tf.saved_model.load(export_dir)  # the exported Keras model: {inputs, segment_ids, positions} -> logits
    seq_len, vocab_size, count = manifest["seq_len"], manifest["vocab_size"], cfg.predict.max_new_tokens
    assert cfg.predict.temperature == 0
    inputs = TASK.testing().predict_inputs(raw, tmp_path)
    _, batch = TASK.predict_inputs(inputs, manifest, export_dir)
    text_prompts = [ids[:length] for ids, length in zip(batch["ids"].tolist(), batch["lengths"].tolist())]
    text_tokens = served_tokens(serve, text_prompts, seq_len)  # the batch predict serves
    prompts = eval_prompts(data, manifest)
    tokens = served_tokens(serve, prompts, seq_len)
    assert [len(row) for row in text_tokens + tokens] == [count] * (len(text_prompts) + len(prompts))
    for prompt, row in zip(text_prompts + prompts, text_tokens + tokens):
        assert ranks(logits_before_each(model, prompt, row, seq_len, vocab_size), row) == [0] * count, (prompt, row)

    processor = tokenizer.processor((data / manifest["tokenizer"]["file"]).read_bytes())
    printed = predict.predict(str(output), inputs)
    assert len(printed) == len(text_tokens)
    for (_, fields), row in zip(printed, text_tokens):
        ended = tokenizer.EOS_ID in row
        kept = row[: row.index(tokenizer.EOS_ID)] if ended else row
        assert fields["continuation"] == processor.DecodeIds(kept) + (" <end>" if ended else "")


def test_a_rerun_of_a_finished_run_exports_again_with_new_predict_keys(lm_run, sample, tmp_path, capsys):
    """`make train ARGS=predict.max_new_tokens=6` on a finished run (config.py's promise) trains
    nothing and writes the export again, generating as the new keys say: 6 tokens each, sampled (not
    the greedy ones) among the 5 likeliest."""
    _, shared, _, _ = lm_run
    _, data = sample
    output = tmp_path / "run"
    shutil.copytree(shared, output)  # the shared run and its export stay as trained for the other tests
    keys = ["predict.max_new_tokens=6", "predict.temperature=3.0", "predict.top_k=5", "predict.seed=7"]
    assert train.main(["--config", str(output / "config.yaml"), f"runtime.output_dir={output}", *keys]) == 0
    assert "resumed from step 48" in capsys.readouterr().out
    serve, manifest, export_dir = predict.load_export(str(output))
    model = tf.saved_model.load(export_dir)
    prompts = eval_prompts(data, manifest)
    tokens = served_tokens(serve, prompts, manifest["seq_len"])
    assert [len(row) for row in tokens] == [6] * len(prompts)
    found = [
        ranks(logits_before_each(model, prompt, row, manifest["seq_len"], manifest["vocab_size"]), row)
        for prompt, row in zip(prompts, tokens)
    ]
    assert max(max(row) for row in found) < 5, found
    assert sum(rank > 0 for row in found for rank in row) >= 5, found  # sampled, not the argmax


def test_the_shipped_decoding_does_not_repeat_one_token(lm_run, sample):
    """The shipped configs' predict keys (seeded top-k sampling) continue the sample's prompts with
    mostly distinct tokens, where greedy decoding of a briefly trained model tends to loop; the share
    of distinct tokens in each 24-token continuation is at least a half."""
    from {{ cookiecutter.package }}.core import model as model_lib
    from {{ cookiecutter.package }}.core import precision

    cfg, output, _, _ = lm_run
    raw, data = sample
    manifest = json.loads((data / "manifest.json").read_text())
    shipped = config.load(str(config_file(NAME)), [], registry=tasks).predict
    assert shipped.temperature > 0 and shipped.top_k > 0
    precision.set_policy("bfloat16")
    model = model_lib.build_model(cfg, TASK, manifest)
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(str(output / "checkpoints"))).expect_partial()
    keys = LanguageModelPredictConfig(max_new_tokens=24, temperature=shipped.temperature, top_k=shipped.top_k)
    serve = TASK.build_serving_signature(model, keys, TASK.objective_config(), manifest)
    tokens = served_tokens(serve, eval_prompts(data, manifest), manifest["seq_len"])
    shares = [len(set(row)) / len(row) for row in tokens]
    assert min(shares) >= 0.5, (shares, tokens)


# Prompts for the tiny model: one token, part of the window, one that fills up while generating, a
# full window and more than a window.
PROMPTS = [np.random.default_rng(2).integers(3, VOCAB, length).tolist() for length in (1, 5, 12, 16, 30)]
NEW_TOKENS = 8


def tiny_sampler(model, **settings):
    """The serving function the export of `model` would have with these `predict.*` keys: prompts -> tokens."""
    keys = LanguageModelPredictConfig(max_new_tokens=NEW_TOKENS, **settings)
    serve = TASK.build_serving_signature(
        model, keys, TASK.objective_config(), {"seq_len": SEQ_LEN, "vocab_size": VOCAB}
    )
    return lambda prompts: served_tokens(serve, prompts, SEQ_LEN)


def test_greedy_generation_shifts_a_full_window_left(tiny_model):
    """An untrained model's argmax changes with every token it reads (unlike the trained one, which
    mostly repeats a few likely pieces): a prompt that fills the window, or more, still gets all its
    tokens, each the argmax after the window dropped its first token."""
    tokens = tiny_sampler(tiny_model, temperature=0.0)(PROMPTS)
    assert [len(row) for row in tokens] == [NEW_TOKENS] * len(PROMPTS)
    for prompt, row in zip(PROMPTS, tokens):
        assert ranks(logits_before_each(tiny_model, prompt, row, SEQ_LEN, VOCAB), row) == [0] * NEW_TOKENS, prompt
    assert len({token for row in tokens for token in row}) > 3  # not one token over and over


def test_top_k_1_samples_the_greedy_tokens_at_any_temperature(tiny_model):
    greedy = tiny_sampler(tiny_model, temperature=0.0)(PROMPTS)
    for temperature, seed in ((0.5, 0), (50.0, 2)):
        assert tiny_sampler(tiny_model, temperature=temperature, top_k=1, seed=seed)(PROMPTS) == greedy, temperature
    # what top_k=1 holds back: the same temperature and seed over all tokens
    assert tiny_sampler(tiny_model, temperature=50.0, seed=2)(PROMPTS) != greedy


def test_sampling_keeps_to_the_top_k_and_follows_its_seed(tiny_model):
    """Sampled tokens are among the k likeliest of their step; the same seed gives each prompt the
    same continuation (in another serving function, whichever prompts share its batch), another
    seed another one."""
    first = tiny_sampler(tiny_model, temperature=2.0, top_k=8, seed=0)(PROMPTS)
    found = [ranks(logits_before_each(tiny_model, p, row, SEQ_LEN, VOCAB), row) for p, row in zip(PROMPTS, first)]
    assert max(max(row) for row in found) < 8, found
    assert sum(rank > 0 for row in found for rank in row) > NEW_TOKENS, found  # sampled, not the argmax
    again = tiny_sampler(tiny_model, temperature=2.0, top_k=8, seed=0)
    assert again(PROMPTS) == first
    assert again(PROMPTS[::-1]) == first[::-1]
    assert again(PROMPTS[2:3]) == first[2:3]
    other = tiny_sampler(tiny_model, temperature=2.0, top_k=8, seed=1)(PROMPTS)
    assert all(mine != theirs for mine, theirs in zip(first, other)), (first, other)


def test_a_window_needs_two_tokens(lm):
    """The shared text keys' rules, with the language model's own shortest window."""
    with pytest.raises(config.ConfigError) as raised:
        config.load(None, ["task=language_model", "data.seq_len=1"], registry=tasks)
    assert str(raised.value) == "data.seq_len must be at least 2, got 1"
    assert config.load(None, ["task=language_model", "data.seq_len=2"], registry=tasks).data.seq_len == 2


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


def test_the_traced_training_flops_match_the_analytical_count():
    """6 x the parameters that multiply per token, plus attention's 12 x layers x window x width
    (Kaplan et al. 2020, Narayanan et al. 2021), for the TPU config's model."""
    from {{ cookiecutter.package }}.core import memory

    cfg = config.load(str(config_file(TASK.name, "tpu")), [], registry=tasks)
    model_config, seq_len = cfg.model, cfg.data.seq_len
    model = build_model(model_config, seq_len, cfg.data.vocab_size)
    width, depth, rows = model_config.width, model_config.depth, 8064
    multiplying = depth * (4 * width * width + 2 * width * model_config.mlp_width) + width * rows  # tied logits
    analytical = seq_len * (6 * multiplying + 12 * depth * seq_len * width)
    traced = memory.trace(model, 2).training_flops_per_example
    assert traced == pytest.approx(analytical, rel=0.1)


@pytest.mark.parametrize("freeze", ["", "block0_mlp_out", "token_embedding"])
@pytest.mark.parametrize("which", ["local", "tpu"])
def test_the_trainers_flops_per_step_are_the_decoders_multiplies_counted_by_hand(lm, which, freeze):
    """What the log's TFLOP/s and MFU divide (utilisation.flops_per_step, which the trainer calls) is
    exactly the decoder's matrix multiplies counted by hand, for each shipped config with 2 steps of
    accumulation: per token, 6 x the weights that multiply it (per block the Q, K, V and output
    projections 4 W^2 and the MLP 2 W M; the tied logits W x rows) plus attention's QK^T and AV,
    12 x layers x window x width (the 6N + attention count of Kaplan et al. 2020); times the tokens
    of an update, the global batch x 2 windows. A frozen layer (`train.freeze`) gets no weight
    gradient, so 2 of its 6 drop out: 2 x in x out per token (the token embedding's are the tied
    logits' W x rows); its input gradient stays, as the layers below it still train."""
    from {{ cookiecutter.package }}.core import memory, topology, utilisation
    from {{ cookiecutter.package }}.core.model import build_model as build_task_model

    frozen = [f"train.freeze=[{freeze}]"] if freeze else []
    cfg = config.load(str(config_file(NAME, which)), ["train.gradient_accumulation_steps=2", *frozen], registry=tasks)
    model = build_task_model(cfg, TASK, TASK.nominal_manifest(cfg.data))
    width, depth, mlp, seq_len = cfg.model.width, cfg.model.depth, cfg.model.mlp_width, cfg.data.seq_len
    rows = -(-cfg.data.vocab_size // 128) * 128  # the embedding table: the vocabulary rounded up to 128 rows
    multiplying = depth * (4 * width * width + 2 * width * mlp) + width * rows
    without = {"": 0, "block0_mlp_out": mlp * width, "token_embedding": width * rows}[freeze]
    per_token = 6 * multiplying - 2 * without + 12 * depth * seq_len * width
    by_hand = per_token * seq_len * cfg.train.global_batch_size * 2
    counted = utilisation.flops_per_step(model, cfg, topology.topology("v5litepod-8"))
    assert counted == pytest.approx(by_hand, rel=1e-9)
    # The doctor's count (the traced training step's, core/memory.py) is the same.
    traced = memory.trace(model, 2).training_flops_per_example * cfg.effective_batch_size
    assert traced == pytest.approx(by_hand, rel=1e-9)


def test_a_frozen_layers_weight_gradient_leaves_the_count_under_the_strategy_too(lm, strategy):
    """Built under the 8 replicas' MirroredStrategy, as training builds it (its weights mirrored
    variables, each replica's with a handle of its own): freezing the first block's MLP output
    takes 2 x its weights per token out of the count, as on one device."""
    from {{ cookiecutter.package }}.core import topology, utilisation
    from {{ cookiecutter.package }}.core.model import build_model as build_task_model

    counts = []
    for frozen in ([], ["train.freeze=[block0_mlp_out]"]):
        cfg = config.load(str(config_file(NAME)), frozen, registry=tasks)
        with strategy.scope():
            model = build_task_model(cfg, TASK, TASK.nominal_manifest(cfg.data))
        counts.append(utilisation.flops_per_step(model, cfg, topology.topology("v5litepod-8")))
    tokens = cfg.data.seq_len * cfg.train.global_batch_size
    assert counts[0] - counts[1] == 2 * cfg.model.mlp_width * cfg.model.width * tokens


def independent_activation_count(cfg, per_replica_batch: int) -> int:
    """Bytes of activations one replica keeps, by Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", arXiv 2205.05198: sbh(34 + 5as/h) per layer in
    16-bit), adjusted to this decoder: an MLP of width f, dropout on the attention probabilities,
    the attention output and the MLP hidden (1-byte masks), the [b, a, s, s] scores in bfloat16:

        per layer = 17 sbh + 5 sbf + 5 as^2 b
        outside   = 7 sbh + 4 sbV               (final norm, tied-logits input, the loss's float32 logits)
        remat     = 2 sbh L + b s^2 + (one layer) + outside
    """
    s, b, h = cfg.data.seq_len, per_replica_batch, cfg.model.width
    f, a, depth = cfg.model.mlp_width, cfg.model.heads, cfg.model.depth
    rows = -(-cfg.data.vocab_size // 128) * 128
    layer = 17 * s * b * h + 5 * s * b * f + 5 * a * s * s * b
    outside = 7 * s * b * h + 4 * s * b * rows
    if cfg.model.remat:
        return 2 * s * b * h * depth + b * s * s + layer + outside
    return depth * layer + outside


@pytest.mark.parametrize("remat, band", [(False, (0.9, 1.6)), (True, (0.9, 1.8))])
def test_the_planned_activations_hold_to_the_independent_count(remat, band):
    """A GPT-2-small-sized decoder (12 x 768, 12 heads, 1024 tokens, 50,257 pieces) at 8 per replica:
    the plan counts the host's unfused graph (LayerNorm's float32 copies, GELU's intermediates),
    which XLA partly fuses away, so it may exceed the count, never fall below it by much."""
    from {{ cookiecutter.package }}.core import memory

    cfg = config.load(
        str(config_file(TASK.name, "tpu")),
        [
            "model.width=768",
            "model.depth=12",
            "model.heads=12",
            "model.mlp_width=3072",
            "data.seq_len=1024",
            "data.vocab_size=50257",
            "train.global_batch_size=64",
            "runtime.mixed_precision=bfloat16",
            f"model.remat={str(remat).lower()}",
        ],
        registry=tasks,
    )
    plan = memory.estimate_for(cfg, TASK, TASK.nominal_manifest(cfg.data), 8, 0)
    ratio = plan.activations / independent_activation_count(cfg, 8)
    assert band[0] <= ratio <= band[1], f"planned / independent activations {ratio:.3f}, outside {band}"


def test_doctor_plans_the_memory_of_a_tpu_chip_and_names_the_levers(capsys):
    """The shipped TPU model fits a 16 GB v5e chip; one twice as wide and 1.5x as deep does not,
    and recomputation makes it fit; 8192-token windows with 8 heads cannot fit with every lever
    (one block's attention over 8 windows is more than the chip)."""
    from {{ cookiecutter.package }} import doctor

    def memory_line(*overrides):
        doctor.main(
            [
                "--config",
                str(config_file(TASK.name, "tpu")),
                "--tpu_type",
                "v5litepod-8",
                "--target",
                "tpu",
                "runtime.output_dir=/tmp/unused",
                "data.dir=/tmp/unused",
                *overrides,
            ]
        )
        return next(line for line in capsys.readouterr().out.splitlines() if "model.memory" in line)

    shipped = memory_line()
    assert shipped.startswith("PASS") and "GiB of 14.9 GiB HBM per v5litepod chip" in shipped
    assert "activations" in shipped and "optimizer slots" in shipped
    wider = memory_line("model.width=512", "model.mlp_width=2048", "model.depth=6")
    assert wider.startswith("FAIL") and "does not fit" in wider
    assert "model.remat=true:" in wider and "train.optimizer=adafactor:" in wider
    assert "with model.remat=true:" in wider and wider.endswith("fits")
    longest = memory_line("data.seq_len=8192", "model.heads=8")
    assert longest.startswith("FAIL") and "it cannot fit one chip with data parallelism" in longest
    assert "train.gradient_accumulation_steps=" in longest and "model parallelism" in longest
    assert "8 examples per replica keep" in longest
    # Close to the limit: a WARN that fits as configured names each lever's effect, no empty combination.
    close = memory_line("train.global_batch_size=1200")
    assert close.startswith("WARN") and "close to the limit" in close, close
    assert "model.remat=true:" in close and "with :" not in close and not close.endswith(";")


def _windows(sequence: list[int], seq_len: int = 6):
    """One packed window batch per seq_len + 1 tokens: inputs and the next tokens as targets (0 pads)."""
    for start in range(0, len(sequence) - 1, seq_len):
        piece = sequence[start : start + seq_len + 1]
        inputs = np.zeros((1, seq_len), np.int32)
        targets = np.zeros((1, seq_len), np.int32)
        inputs[0, : len(piece) - 1], targets[0, : len(piece) - 1] = piece[:-1], piece[1:]
        yield {"inputs": inputs}, targets


def test_the_bigram_baseline_is_witten_bell_over_the_unigram():
    """Against a direct count of the same formulas: unigram add-one smoothed (what the manifest's
    unigram_perplexity computes), bigram interpolated by Witten-Bell; a text whose next token
    follows from the current one is far more predictable to the bigram."""
    rng = np.random.default_rng(0)
    vocab = 12
    train = [3, 4, 5, 6] * 20 + rng.integers(3, vocab, size=40).tolist()
    evaluation = [3, 4, 5, 6, 3, 4, 11, 5, 6, 3]
    found = TASK.score_baselines(_windows(train), _windows(evaluation), {"vocab_size": vocab})

    pairs = Counter(zip(train[:-1], train[1:]))
    unigram = Counter(train[1:])
    total = sum(unigram.values())
    log_uni = log_bi = 0.0
    for previous, token in zip(evaluation[:-1], evaluation[1:]):
        p_uni = (unigram[token] + 1) / (total + vocab)
        seen = sum(count for (first, _), count in pairs.items() if first == previous)
        followers = len({second for first, second in pairs if first == previous})
        keep = seen / (seen + followers) if seen else 0.0
        p_bi = keep * (pairs[previous, token] / seen if seen else 0.0) + (1 - keep) * p_uni
        log_uni, log_bi = log_uni + math.log(p_uni), log_bi + math.log(p_bi)
    steps = len(evaluation) - 1
    assert found["unigram"]["perplexity"] == pytest.approx(math.exp(-log_uni / steps), rel=1e-9)
    assert found["bigram"]["perplexity"] == pytest.approx(math.exp(-log_bi / steps), rel=1e-9)
    eval_counts = Counter(evaluation[1:])
    unigram_ppl = unigram_perplexity(unigram, eval_counts, vocab)
    assert found["unigram"]["perplexity"] == pytest.approx(unigram_ppl, rel=1e-9)
    assert found["bigram"]["perplexity"] < 0.5 * found["unigram"]["perplexity"]

    # Accuracy: each model's likeliest next token over the whole vocabulary (ties: the lower id).
    def p_bigram(previous: int, token: int) -> float:
        seen = sum(count for (first, _), count in pairs.items() if first == previous)
        followers = len({second for first, second in pairs if first == previous})
        keep = seen / (seen + followers) if seen else 0.0
        p_uni = (unigram[token] + 1) / (total + vocab)
        return keep * (pairs[previous, token] / seen if seen else 0.0) + (1 - keep) * p_uni

    favourite = max(range(vocab), key=lambda token: (unigram[token], -token))
    steps_taken = list(zip(evaluation[:-1], evaluation[1:]))
    likeliest = {p: max(range(vocab), key=lambda t: (p_bigram(p, t), -t)) for p, _ in steps_taken}
    assert found["unigram"]["accuracy"] == pytest.approx(sum(t == favourite for _, t in steps_taken) / steps)
    assert found["bigram"]["accuracy"] == pytest.approx(sum(likeliest[p] == t for p, t in steps_taken) / steps)
    assert found["bigram"]["accuracy"] > found["unigram"]["accuracy"]


def test_a_shared_tokenizer_encodes_with_the_sources_ids(sample, tmp_path):
    """data.tokenizer: preprocessing encodes with the named tokenizer (a data folder, a run's export or
    the file) instead of training one, whatever data.vocab_size says; one without an end-of-document
    id, one that is not a SentencePiece model and a folder without one are each one line."""
    from {{ cookiecutter.package }}.core.errors import UserError
    from {{ cookiecutter.package }}.tasks.text import tokenizer

    raw, data = sample
    source = json.loads((data / "manifest.json").read_text())
    shared = run_preprocess(
        raw, tmp_path / "shared", "--config", str(config_file(NAME)), f"data.tokenizer={data}", "data.vocab_size=64"
    )
    assert (
        shared["tokenizer"]["sha256"] == source["tokenizer"]["sha256"] and shared["vocab_size"] == source["vocab_size"]
    )
    assert (tmp_path / "shared" / tokenizer.MODEL_FILE).read_bytes() == (data / tokenizer.MODEL_FILE).read_bytes()
    model_bytes = (data / tokenizer.MODEL_FILE).read_bytes()
    assert tokenizer.shared(str(data / tokenizer.MODEL_FILE), end_of_document=True) == model_bytes
    run = tmp_path / "run" / "export" / "assets.extra"
    run.mkdir(parents=True)
    (run / tokenizer.MODEL_FILE).write_bytes(model_bytes)
    assert tokenizer.shared(str(tmp_path / "run"), end_of_document=True) == model_bytes
    assert tokenizer.shared(str(tmp_path / "run" / "export"), end_of_document=True) == model_bytes

    plain = tmp_path / "plain.model"
    plain.write_bytes(tokenizer.fit(["a plain text of a few words"] * 50, 24, 100, end_of_document=False))
    assert tokenizer.shared(str(plain)) == plain.read_bytes()
    with pytest.raises(UserError, match=r"has no end-of-document id \(2\), which a next-token model predicts"):
        tokenizer.shared(str(plain), end_of_document=True)
    (tmp_path / "broken.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match="broken.model is not a SentencePiece model"):
        tokenizer.shared(str(tmp_path / "broken.model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=f"data.tokenizer={tmp_path / 'empty'} holds no tokenizer.model"):
        tokenizer.shared(str(tmp_path / "empty"))


def test_a_shared_tokenizer_is_read_from_gcs(sample, gcs_bucket):
    """data.tokenizer=gs://...: a run directory in a bucket (its export's copy), the file itself, and
    a folder without one refused in one line, through Beam's filesystem with no request outside the
    emulator."""
    from apache_beam.io.filesystems import FileSystems

    from {{ cookiecutter.package }}.core.errors import UserError

    _, data = sample
    model_bytes = (data / tokenizer.MODEL_FILE).read_bytes()
    exported = gcs_bucket.path("runs", "pretrain", "export", "assets.extra", tokenizer.MODEL_FILE)
    with FileSystems.create(exported) as handle:
        handle.write(model_bytes)
    assert tokenizer.shared(gcs_bucket.path("runs", "pretrain"), end_of_document=True) == model_bytes
    assert tokenizer.shared(exported, end_of_document=True) == model_bytes
    with pytest.raises(UserError, match=r"data.tokenizer=gs://\S+/elsewhere holds no tokenizer.model"):
        tokenizer.shared(gcs_bucket.path("elsewhere"))
    assert gcs_bucket.blocked_requests() == []
