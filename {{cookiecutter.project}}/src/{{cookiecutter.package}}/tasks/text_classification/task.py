"""Text classification: RAW texts -> SentencePiece ids -> a Transformer encoder -> a label per text.

raw input       RAW/<label>/<name>.txt (one text per file) or RAW/*.jsonl ({"text", "label"} lines)
preprocessing   read_raw -> fit_encoding (tokenizer.model, trained on the train split) -> encode (the
                window's ids, cut by data.truncation, and the bag of every piece of the whole text)
input           parse_batch: ids padded to exactly [batch, data.seq_len], int32
baselines       the majority class and naive Bayes on the bag of the whole text (parse_bag)
model           model.py: a pre-LayerNorm Transformer encoder, masked pooling, an optional bag of
                pieces and pairs beside it (model.bag_width), logits
serving         ids [None, seq_len] -> probabilities and class; predict tokenizes text lines
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...core.errors import UserError
from ...core.task import Listing, Manifest, RawExample, RawRejection, Testing, files_under
from ..classification import ClassificationTask
from ..text import raw
from . import doctor_rules, sample_data, tokenizer
from ..text.config import width_fix
from .config import ClassifierDataConfig, ClassifierModelConfig
from .corpora import CORPORA


class TextClassificationTask(ClassificationTask):
    name = "text_classification"
    data_config = ClassifierDataConfig
    model_config = ClassifierModelConfig
    raw_format = 'RAW/<label>/<name>.txt (one UTF-8 text per file) or RAW/*.jsonl (lines of {"text": .., "label": ..})'
    reject_reasons = {**raw.REJECT_REASONS, "missing_field": "a JSON Lines object without a string `text` or `label`"}
    # `make bench-preprocess` on a 2-core AMD EPYC (AVX2): worker processes overtook the in-process runner
    # between 0.9 MB and 5.5 MB of raw text; at 26 MB, 1.33x its speed (0.82x the plain loop's).
    multi_process_from_bytes = 5_000_000

    # --------------------------------------------------------------- preprocessing (Beam)
    def list_raw(self, input_root: str) -> Listing:
        root = input_root.rstrip("/")
        units, ignored = [], 0
        for relative in files_under(root):
            depth, lower = relative.count("/"), relative.lower()
            # A .txt file counts only inside a label folder: a README.txt beside them has no label.
            if (depth == 1 and lower.endswith(raw.TEXT_SUFFIX)) or (depth == 0 and lower.endswith(raw.JSONL_SUFFIX)):
                units.append(relative)
            else:
                ignored += 1
        if not units:
            raise UserError(
                f"no texts found under {root}: expected {root}/<label>/*.txt or {root}/*.jsonl; "
                f"run `make data` for the sample set or point RAW at a text folder"
            )
        return Listing(units=sorted(units), ignored=ignored)

    def read_raw(self, relative: str, raw_bytes: bytes) -> Iterator[RawExample | RawRejection]:
        if raw.is_jsonl(relative):
            yield from raw.read_jsonl(relative, raw_bytes, target_field="label")
        else:
            yield from raw.read_text_file(relative, raw_bytes, relative.split("/", 1)[0])

    def fit_encoding(
        self, train_payloads: Sequence[Any], data_config: ClassifierDataConfig, workdir: str
    ) -> dict[str, bytes]:
        return {tokenizer.MODEL_FILE: tokenizer.fit_or_share(train_payloads, data_config)}

    def encoding_sample_size(self, data_config: ClassifierDataConfig) -> int:
        return data_config.tokenizer_sample

    def encode(
        self,
        example: RawExample,
        data_config: ClassifierDataConfig,
        vocabularies: dict[str, list[str]],
        artifacts: dict[str, bytes],
    ) -> tuple[bytes, dict]:
        ids = tokenizer.tokenize_or_reject(artifacts[tokenizer.MODEL_FILE], example.payload)
        kept = tokenizer.window(ids, data_config.seq_len, data_config.truncation)
        stats = {
            "examples": 1,
            "tokens": len(ids),
            "truncated": int(len(ids) > data_config.seq_len),
            "kept_tokens": len(kept),
            "kept_share": len(kept) / len(ids),  # summed here, a mean over the texts in the manifest
        }
        return tokenizer.serialize(kept, self.label_index(example, vocabularies), document=ids), stats

    def feature_spec(self, data_config: ClassifierDataConfig) -> dict:
        return tokenizer.feature_spec(data_config.seq_len, data_config.truncation)

    def manifest_fields(
        self,
        stats: dict,
        data_config: ClassifierDataConfig,
        artifacts: dict[str, bytes],
        vocabularies: dict[str, list[str]],
    ) -> dict:
        model_bytes = artifacts[tokenizer.MODEL_FILE]
        pieces = tokenizer.vocab_size(model_bytes)
        examples = stats.get("examples", 0)
        positions = examples * data_config.seq_len
        return {
            **super().manifest_fields(stats, data_config, artifacts, vocabularies),
            "seq_len": data_config.seq_len,
            "truncation": data_config.truncation,
            "vocab_size": pieces,
            "tokenizer": {
                "file": tokenizer.MODEL_FILE,
                "sha256": tokenizer.sha256(model_bytes),
                "vocab_size": pieces,
                "pad_id": tokenizer.PAD_ID,
                "unk_id": tokenizer.UNK_ID,
            },
            "length_stats": {
                "mean_tokens": round(stats.get("tokens", 0) / examples, 2) if examples else 0.0,
                "share_truncated": round(stats.get("truncated", 0) / examples, 4) if examples else 0.0,
                # The mean over the texts of the share of each text's pieces the window keeps.
                "mean_kept": round(stats.get("kept_share", 0) / examples, 4) if examples else 1.0,
                # Share of the [examples, seq_len] positions that padding fills: compute spent on nothing.
                "mean_padding": round(1 - stats.get("kept_tokens", 0) / positions, 4) if positions else 0.0,
            },
        }

    def bytes_per_example(self, data_config: ClassifierDataConfig) -> int:
        # ids below 2**14 take 2 bytes as varints; a third per id covers larger vocabularies and framing.
        # The bag of the whole text adds an id and a count per distinct piece: about a window's worth more.
        return data_config.seq_len * 6 + 48

    # --------------------------------------------------------------- input (tf.data)
    def check_manifest(self, manifest: Manifest, data_config: ClassifierDataConfig, data_dir: str) -> None:
        raw.check_shards(manifest, data_config, data_dir, "sequences")
        written = manifest.get("truncation", "head")
        if written != data_config.truncation:
            raise UserError(
                f"data.truncation is {data_config.truncation} but the shards in {data_dir} were cut by "
                f"{written}; set data.truncation={written}, or re-run "
                f"`make preprocess ARGS=data.truncation={data_config.truncation}`"
            )

    def parse_batch(self, serialized, manifest: Manifest, training: bool = False, seed=None, data_config=None):
        return tokenizer.parse_batch(serialized, manifest["seq_len"])

    def padding_record(self, manifest: Manifest) -> bytes:
        # One unknown token rather than none: every row then has a token to pool over.
        return tokenizer.serialize([tokenizer.UNK_ID], 0)

    def synthetic_batch(self, batch_size: int, manifest: Manifest):
        import tensorflow as tf

        # Ids from 2: random text has no padding (0) and rarely unknown pieces (1).
        ids = tf.random.uniform(
            [batch_size, manifest["seq_len"]], minval=2, maxval=manifest["vocab_size"], dtype=tf.int32
        )
        return ids, self.random_targets(batch_size, manifest)

    def baseline_batch(self, serialized, manifest: Manifest):
        """What the baselines read (core/baselines.py): the bag of every piece of each whole text."""
        return tokenizer.parse_bag(serialized, manifest["vocab_size"])

    def describe_data(self, manifest: Manifest) -> str:
        sequences = f"sequences of {manifest['seq_len']} tokens, vocabulary {manifest['vocab_size']}"
        return f"{super().describe_data(manifest)}, {sequences}{window_coverage(manifest)}"

    # --------------------------------------------------------------- model
    def build_model(self, model_config: ClassifierModelConfig, manifest: Manifest):
        from . import model as model_lib

        return model_lib.build_model(model_config, manifest["seq_len"], manifest["vocab_size"], manifest["num_classes"])

    def nominal_manifest(self, data_config: ClassifierDataConfig) -> dict:
        return {
            "seq_len": data_config.seq_len,
            "truncation": data_config.truncation,
            "vocab_size": data_config.vocab_size,
            "num_classes": 10,
        }

    def width_fix(self, model_config: ClassifierModelConfig, quantum: int) -> str:
        return width_fix(model_config, quantum)

    # --------------------------------------------------------------- baselines
    baseline_advice = (
        "model.bag_width=32 adds a bag of pieces and adjacent pairs beside the Transformer (fastText), "
        "which learns the word counts and short phrases that carry most of the signal in a small corpus"
    )

    def score_baselines(self, train, evaluation, manifest: Manifest) -> dict[str, float]:
        """The majority class, and a multinomial naive Bayes on the counts of every piece of each whole
        text (`baseline_batch`: not only the window the model reads, so a window that cuts off the
        signal shows as a model below naive Bayes)."""
        from ..classification import linear_baselines

        return linear_baselines(
            train, evaluation, manifest["num_classes"], lambda counts: counts, "naive_bayes", "bag-of-words"
        )

    # --------------------------------------------------------------- serving
    def build_serving_signature(self, model, predict_config, objective_config, manifest: Manifest):
        import tensorflow as tf

        @tf.function(input_signature=[tf.TensorSpec([None, manifest["seq_len"]], tf.int32, name="ids")])
        def serve(ids):
            return self.serve_logits(model(ids, training=False))

        return serve

    def export_assets(self, manifest: Manifest, data_dir: str) -> dict[str, bytes]:
        import tensorflow as tf

        name = (manifest.get("tokenizer") or {}).get("file", tokenizer.MODEL_FILE)
        with tf.io.gfile.GFile(raw.join(data_dir, name), "rb") as handle:
            return {**super().export_assets(manifest, data_dir), name: handle.read()}

    def predict_inputs(self, inputs: Sequence[str], manifest: Manifest, export_dir: str) -> tuple[list[str], Any]:
        model_bytes = raw.exported_tokenizer(export_dir, tokenizer.MODEL_FILE)
        lines = raw.input_lines(inputs, "text")
        sequences = [tokenizer.tokenize(model_bytes, line) for _, line in lines]
        batch = tokenizer.pad_batch(sequences, manifest["seq_len"], manifest.get("truncation", "head"))
        return [name for name, _ in lines], batch

    # --------------------------------------------------------------- the rest
    def write_sample_data(self, output: Path, seed: int = 0, small: bool = False) -> str:
        return sample_data.write_sample_data(output, seed=seed, small=small)

    def corpora(self) -> dict:
        return CORPORA

    def doctor_rules(self) -> list:
        return doctor_rules.rules()

    def testing(self) -> Testing:
        # 32 tokens, a small vocabulary, one block; AdamW at a rate that learns within a test run.
        return Testing(
            overrides=(
                "data.seq_len=32",
                "data.vocab_size=300",
                "model.width=32",
                "model.depth=1",
                "model.heads=2",
                "model.mlp_width=64",
                "train.base_learning_rate=0.02",
            ),
            rejected=4,
            mismatch="data.seq_len=48",
            predict_inputs=_two_texts,
            encoding_sample="data.tokenizer_sample=5",
        )


def _two_texts(raw: Path, scratch: Path) -> list[str]:
    path = scratch / "texts.txt"
    path.write_text("The striker scored twice in the final minutes.\nBake the bread for forty minutes.\n")
    return [str(path)]


def window_coverage(manifest: Manifest) -> str:
    """'; the window (first 128 pieces) keeps 41% of a text's pieces on average, 87% of texts
    truncated' from the manifest's length statistics (empty without them): how much of the texts the
    model reads, where the baselines read all of them."""
    stats = manifest.get("length_stats") or {}
    if "mean_kept" not in stats:
        return ""
    seq_len = manifest["seq_len"]
    both_ends = manifest.get("truncation", "head") == "head_tail"
    cut = f"first {seq_len // 2} and last {seq_len - seq_len // 2}" if both_ends else f"first {seq_len}"
    return (
        f"; the window ({cut} pieces) keeps {stats['mean_kept']:.0%} of a text's pieces "
        f"on average, {stats['share_truncated']:.0%} of texts truncated"
    )


TASK = TextClassificationTask()
