"""Language model: unlabelled texts -> SentencePiece ids -> packed windows -> a decoder-only Transformer
that predicts each next token.

raw input       RAW/**/*.txt (one document per file) or RAW/*.jsonl ({"text": ...} lines)
preprocessing   read_raw -> fit_encoding (tokenizer.model with an end-of-document id, on the train split)
                -> encode (one document) -> pack (a shard's documents -> windows of seq_len)
input           parse_batch: {inputs, segment_ids, positions} and targets, int32 [batch, seq_len]
model           model.py: causal attention within each packed document, float32 logits
objective       objective.py: token cross entropy; perplexity (headline, lower is better), accuracy
serving         generate.py: prompt ids [None, seq_len] -> a continuation, inside the SavedModel
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...core.errors import UserError
from ...core.task import Listing, Manifest, RawExample, RawRejection, Task, Testing, files_under
from ..text import doctor_rules as text_rules
from ..text import raw, tokenizer
from ..text.config import width_fix
from . import packing, sample_data
from .config import LanguageModelConfig, LanguageModelDataConfig, LanguageModelPredictConfig
from .corpora import CORPORA

TARGET_COUNT = "target_count:"
"""Prefix of the pack statistics that count each target id per split (for the unigram baseline)."""
MAX_PADDING_SHARE = 0.1


class LanguageModelTask(Task):
    name = "language_model"
    data_config = LanguageModelDataConfig
    model_config = LanguageModelConfig
    predict_config = LanguageModelPredictConfig
    raw_format = 'RAW/**/*.txt (one UTF-8 document per file) or RAW/*.jsonl (lines of {"text": ..})'
    reject_reasons = {**raw.REJECT_REASONS, "missing_field": "a JSON Lines object without a string `text`"}
    headline_metric = "perplexity"
    higher_is_better = False
    size_statistic = "document_tokens"  # a document's share of the windows is its share of the tokens
    size_advice = "data.max_document_windows=N keeps a document's first N windows"
    # `make bench-preprocess` on a 2-core AMD EPYC (AVX2): worker processes overtook the in-process runner
    # between 1.3 MB and 6.6 MB of raw text (about 4.2 MB); at 30 MB, 1.08x the plain loop's speed.
    multi_process_from_bytes = 5_000_000

    # --------------------------------------------------------------- preprocessing (Beam)
    def list_raw(self, input_root: str) -> Listing:
        root = input_root.rstrip("/")
        units, ignored = [], 0
        for relative in files_under(root):
            lower = relative.lower()
            if lower.endswith(raw.TEXT_SUFFIX) or (relative.count("/") == 0 and lower.endswith(raw.JSONL_SUFFIX)):
                units.append(relative)
            else:
                ignored += 1
        if not units:
            raise UserError(
                f"no documents found under {root}: expected {root}/**/*.txt or {root}/*.jsonl; "
                f"run `make data` for the sample set or point RAW at a text folder"
            )
        return Listing(units=sorted(units), ignored=ignored)

    def read_raw(self, relative: str, raw_bytes: bytes) -> Iterator[RawExample | RawRejection]:
        if raw.is_jsonl(relative):
            yield from raw.read_jsonl(relative, raw_bytes, target_field=None)
        else:
            yield from raw.read_text_file(relative, raw_bytes, None)

    def fit_encoding(
        self, train_payloads: Sequence[Any], data_config: LanguageModelDataConfig, workdir: str
    ) -> dict[str, bytes]:
        return {tokenizer.MODEL_FILE: tokenizer.fit_or_share(train_payloads, data_config, end_of_document=True)}

    def encoding_sample_size(self, data_config: LanguageModelDataConfig) -> int:
        return data_config.tokenizer_sample

    def encode(
        self,
        example: RawExample,
        data_config: LanguageModelDataConfig,
        vocabularies: dict[str, list[str]],
        artifacts: dict[str, bytes],
    ) -> tuple[bytes, dict]:
        ids = tokenizer.tokenize_or_reject(artifacts[tokenizer.MODEL_FILE], example.payload)
        if data_config.max_document_windows:
            ids = ids[: data_config.max_document_windows * data_config.seq_len]
        return packing.document_record(ids), {"documents": 1, "document_tokens": len(ids) + 1}

    def pack(
        self, split: str, records: Sequence[bytes], data_config: LanguageModelDataConfig
    ) -> tuple[list[bytes], dict]:
        windows, targets = packing.pack(records, data_config.seq_len)
        stats = defaultdict(float, {f"{split}_documents": len(records), f"{split}_windows": len(windows)})
        for token in targets:
            stats[f"{TARGET_COUNT}{split}:{token}"] += 1
        stats[f"{split}_targets"] = len(targets)
        return windows, dict(stats)

    def feature_spec(self, data_config: LanguageModelDataConfig) -> dict:
        return packing.feature_spec(data_config.seq_len)

    def manifest_fields(
        self, stats: dict, data_config: LanguageModelDataConfig, artifacts: dict[str, bytes], vocabularies
    ) -> dict:
        model_bytes = artifacts[tokenizer.MODEL_FILE]
        pieces = tokenizer.vocab_size(model_bytes)
        counts = {"train": {}, "eval": {}}
        for key, value in stats.items():
            if key.startswith(TARGET_COUNT):
                split, token = key[len(TARGET_COUNT) :].split(":")
                counts[split][int(token)] = value
        packed = {}
        for split in ("train", "eval"):
            windows, targets = int(stats.get(f"{split}_windows", 0)), int(stats.get(f"{split}_targets", 0))
            positions = windows * data_config.seq_len
            packed[split] = {
                "documents": int(stats.get(f"{split}_documents", 0)),
                "windows": windows,
                "tokens": targets,
                # Share of the [windows, seq_len] positions without a target: compute spent on nothing.
                "padding_share": round(1 - targets / positions, 4) if positions else 0.0,
            }
        unigram = objective_unigram(counts, pieces)
        return {
            "seq_len": data_config.seq_len,
            "vocab_size": pieces,
            "tokenizer": {
                "file": tokenizer.MODEL_FILE,
                "sha256": tokenizer.sha256(model_bytes),
                "vocab_size": pieces,
                "pad_id": tokenizer.PAD_ID,
                "unk_id": tokenizer.UNK_ID,
                "eos_id": tokenizer.EOS_ID,
            },
            "packing": packed,
            "unigram_perplexity": round(unigram, 4) if math.isfinite(unigram) else None,
        }

    def bytes_per_example(self, data_config: LanguageModelDataConfig) -> int:
        # Four int64 columns of seq_len varints (ids below 2**14 take 2 bytes, the rest 1), and framing.
        return data_config.seq_len * 6 + 64

    # --------------------------------------------------------------- input (tf.data)
    def check_manifest(self, manifest: Manifest, data_config: LanguageModelDataConfig, data_dir: str) -> None:
        raw.check_shards(manifest, data_config, data_dir, "windows")

    def parse_batch(self, serialized, manifest: Manifest, training: bool = False, seed=None, data_config=None):
        return packing.parse_batch(serialized, manifest["seq_len"])

    def padding_record(self, manifest: Manifest) -> bytes:
        return packing.padding_record(manifest["seq_len"])

    def synthetic_batch(self, batch_size: int, manifest: Manifest):
        import tensorflow as tf

        seq_len = manifest["seq_len"]
        # Ids from 3: random text has no padding, unknown or end-of-document ids; one document per window.
        ids = tf.random.uniform([batch_size, seq_len + 1], minval=3, maxval=manifest["vocab_size"], dtype=tf.int32)
        ones = tf.ones([batch_size, seq_len], tf.int32)
        positions = tf.broadcast_to(tf.range(seq_len), [batch_size, seq_len])
        return {"inputs": ids[:, :-1], "segment_ids": ones, "positions": positions}, ids[:, 1:]

    def describe_data(self, manifest: Manifest) -> str:
        train = manifest.get("packing", {}).get("train", {})
        return (
            f"windows of {manifest['seq_len']} tokens, vocabulary {manifest['vocab_size']}, "
            f"{train.get('tokens', 0)} train tokens in {train.get('documents', 0)} documents"
        )

    # --------------------------------------------------------------- model
    def build_model(self, model_config: LanguageModelConfig, manifest: Manifest):
        from . import model as model_lib

        return model_lib.build_model(model_config, manifest["seq_len"], manifest["vocab_size"])

    def nominal_manifest(self, data_config: LanguageModelDataConfig) -> dict:
        return {"seq_len": data_config.seq_len, "vocab_size": data_config.vocab_size}

    def width_fix(self, model_config: LanguageModelConfig, quantum: int) -> str:
        return width_fix(model_config, quantum)

    def output_layers(self, model) -> list[str]:
        # The logits' width is the embedding table's rows (the vocabulary), not a choice.
        return ["logits"]

    # --------------------------------------------------------------- objective
    def build_loss(self, objective_config, manifest: Manifest):
        from .objective import TokenCrossEntropy

        return TokenCrossEntropy()

    def build_metrics(self, objective_config, manifest: Manifest) -> list:
        from .objective import TokenMetric

        return [TokenMetric("perplexity"), TokenMetric("accuracy")]

    def score_baselines(self, train, evaluation, manifest: Manifest) -> dict[str, float]:
        from .objective import ngram_baselines

        return ngram_baselines(train, evaluation, manifest["vocab_size"])

    # --------------------------------------------------------------- serving
    def build_serving_signature(
        self, model, predict_config: LanguageModelPredictConfig, objective_config, manifest: Manifest
    ):
        import tensorflow as tf

        from . import generate

        seq_len, vocab, settings = manifest["seq_len"], manifest["vocab_size"], predict_config

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, seq_len], tf.int32, name="ids"),
                tf.TensorSpec([None], tf.int32, name="lengths"),
            ]
        )
        def serve(ids, lengths):
            tokens = generate.generate(
                model,
                ids,
                lengths,
                seq_len=seq_len,
                vocab_size=vocab,
                max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                top_k=settings.top_k,
                seed=settings.seed,
            )
            return {
                "tokens": tokens,
                "prompt_log_likelihood": generate.prompt_log_likelihood(model, ids, lengths, seq_len),
            }

        return serve

    def export_assets(self, manifest: Manifest, data_dir: str) -> dict[str, bytes]:
        import tensorflow as tf

        name = (manifest.get("tokenizer") or {}).get("file", tokenizer.MODEL_FILE)
        with tf.io.gfile.GFile(raw.join(data_dir, name), "rb") as handle:
            return {name: handle.read()}

    def predict_inputs(self, inputs: Sequence[str], manifest: Manifest, export_dir: str) -> tuple[list[str], Any]:
        import numpy as np

        from .generate import prompt_window

        model_bytes = raw.exported_tokenizer(export_dir, tokenizer.MODEL_FILE)
        lines = raw.input_lines(inputs, "prompt")
        windows = [prompt_window(tokenizer.tokenize(model_bytes, line), manifest["seq_len"]) for _, line in lines]
        batch = {
            "ids": np.array([window for window, _ in windows], dtype=np.int32),
            "lengths": np.array([length for _, length in windows], dtype=np.int32),
        }
        return [name for name, _ in lines], batch

    def predictions(self, inputs, outputs: dict, manifest: Manifest, export_dir: str) -> list[dict]:
        processor = tokenizer.processor(raw.exported_tokenizer(export_dir, tokenizer.MODEL_FILE))
        rows = []
        for tokens in outputs["tokens"].tolist():
            ended = tokenizer.EOS_ID in tokens
            kept = tokens[: tokens.index(tokenizer.EOS_ID)] if ended else tokens
            rows.append({"continuation": processor.DecodeIds(kept) + (" <end>" if ended else "")})
        return rows

    # --------------------------------------------------------------- the rest
    def write_sample_data(self, output: Path, seed: int = 0, small: bool = False) -> str:
        return sample_data.write_sample_data(output, seed=seed, small=small)

    def corpora(self) -> dict:
        return CORPORA

    def doctor_rules(self) -> list:
        return [
            ("data.seq_len_tiles", text_rules.seq_len_tiles),
            ("model.embedding_rows", text_rules.embedding_rows),
            ("data.packing", packing_rule),
        ]

    def testing(self) -> Testing:
        # 32-token windows, a small vocabulary, one block; AdamW at a rate that learns within a test run;
        # greedy decoding, which the tests check token by token (the shipped configs sample).
        return Testing(
            overrides=(
                "data.seq_len=32",
                "data.vocab_size=200",
                "model.width=32",
                "model.depth=1",
                "model.heads=2",
                "model.mlp_width=64",
                "model.dropout=0.0",
                "predict.max_new_tokens=4",
                "predict.temperature=0.0",  # greedy: the export's tokens are checked against the argmax
                "train.base_learning_rate=0.02",
            ),
            rejected=4,
            mismatch="data.seq_len=48",
            predict_inputs=_two_prompts,
            encoding_sample="data.tokenizer_sample=5",
        )


def objective_unigram(counts: dict, vocab_size: int) -> float:
    return unigram_perplexity(counts["train"], counts["eval"], vocab_size)


def unigram_perplexity(train_counts: dict[int, float], eval_counts: dict[int, float], vocab_size: int) -> float:
    """Perplexity of the eval targets under the train targets' token frequencies, add-one smoothed:
    what a model that ignores all context scores. A language model that learned anything beats it."""
    train_total = sum(train_counts.values())
    eval_total = sum(eval_counts.values())
    if not eval_total:
        return float("nan")
    log_likelihood = sum(
        count * math.log((train_counts.get(token, 0.0) + 1.0) / (train_total + vocab_size))
        for token, count in eval_counts.items()
    )
    return math.exp(-log_likelihood / eval_total)


def packing_rule(cfg, target, manifest):
    """How much of the packed windows is padding (only each shard's last window has any)."""
    packed = (manifest or {}).get("packing")
    if not packed:
        return "skip", "no packing statistics (run `make preprocess` first)", ""
    share = packed["train"]["padding_share"]
    facts = (
        f"{packed['train']['documents']} train documents packed into {packed['train']['windows']} windows of "
        f"{manifest.get('seq_len')} tokens, {share:.1%} padding"
    )
    if share > MAX_PADDING_SHARE:
        return "warn", facts, "fewer shards (--num_shards) or a shorter data.seq_len leave less padding"
    return "pass", facts, ""


def _two_prompts(raw_dir: Path, scratch: Path) -> list[str]:
    path = scratch / "prompts.txt"
    path.write_text("Mia was a little fox who\nEvery morning, he walked to the\n")
    return [str(path)]


TASK = LanguageModelTask()
