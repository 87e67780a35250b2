"""The SentencePiece tokenizer of the text tasks: trained in the Beam job on the train split, loaded
once per process, and the facts the manifest records about it.

Preprocessing trains a unigram model on the train split (`fit`, called by the tasks' `fit_encoding`)
and writes it beside the shards as `tokenizer.model`; the same file is exported with the SavedModel
and `predict` tokenizes with it.
The manifest holds its sha256, so training refuses shards whose tokenizer was replaced.

Id 0 is padding and id 1 the unknown piece. With `end_of_document` the model also reserves id 2
for the end of a document, which a next-token model learns to predict; a classifier pools the whole
sequence and needs none.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Sequence

from ...core.errors import UserError
from ...core.task import Rejected

MODEL_FILE = "tokenizer.model"
PAD_ID = 0
UNK_ID = 1
EOS_ID = 2
"""The end-of-document id, reserved only in a tokenizer trained with `end_of_document=True`."""
MAX_TRAINING_LINE_BYTES = 16384
"""SentencePiece skips training lines longer than this (its default of 4192 drops long paragraphs)."""
TRAINING_THREADS = 4
"""Fixed, not the machine's core count: each thread sums its share of the EM statistics, so the
thread count changes the floating-point sums and with them the pieces (measured: 1, 3 and 8
threads give three different models from the same text)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- training


def training_lines(texts: Iterable[str], max_texts: int) -> list[str]:
    """The lines SentencePiece trains on: at most `max_texts` texts, chosen and ordered by content
    alone, so the same train split gives the same tokenizer whatever order Beam delivers it in."""
    unique = sorted(set(texts), key=lambda text: (sha256(text.encode("utf-8")), text))[:max_texts]
    return [line.strip() for text in sorted(unique) for line in text.splitlines() if line.strip()]


def fit(train_texts: Sequence[str], vocab_size: int, max_texts: int, end_of_document: bool = False) -> bytes:
    """Trains a unigram SentencePiece model; returns the bytes of its `.model` file.

    Deterministic: the sample is chosen and sorted by content, SentencePiece neither samples nor
    shuffles it, and the thread count is fixed, so the same texts give a byte-identical model.
    `hard_vocab_limit=False` lets a small corpus yield fewer pieces than asked for instead of
    failing; the manifest records the actual count.
    """
    import sentencepiece as spm

    lines = training_lines(train_texts, max_texts)
    if not lines:
        raise UserError("the train split holds no text to train the tokenizer on; check RAW and data.eval_fraction")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="unigram",
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            eos_id=EOS_ID if end_of_document else -1,
            hard_vocab_limit=False,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=TRAINING_THREADS,
            max_sentence_length=MAX_TRAINING_LINE_BYTES,
            minloglevel=2,
        )
    except RuntimeError as error:
        # The one a user meets: more distinct characters than data.vocab_size (e.g. CJK text).
        reason = str(error).split("] ", 1)[-1].split(". Increase", 1)[0]
        raise UserError(
            f"SentencePiece cannot train a tokenizer of data.vocab_size={vocab_size} on this text "
            f"({reason}); raise data.vocab_size"
        ) from None
    return model.getvalue()


def shared(location: str, end_of_document: bool = False) -> bytes:
    """The bytes of the SentencePiece model `data.tokenizer` names, to encode with instead of training
    one: a `.model` file, a folder of shards that holds one (`tokenizer.model` beside the manifest),
    a run directory or its export (the one the export holds). So text encoded for a fine-tune gets the ids the
    pretraining's weights were trained on. One that was not made here (other special ids), or without
    an end-of-document id where `end_of_document` needs one, is a one-line UserError."""
    from apache_beam.io.filesystems import FileSystems

    base = location.rstrip("/")
    candidates = [
        location,
        f"{base}/{MODEL_FILE}",
        f"{base}/export/assets.extra/{MODEL_FILE}",
        f"{base}/assets.extra/{MODEL_FILE}",
    ]
    found = next((path for path in candidates if not path.endswith("/") and _is_file(FileSystems, path)), None)
    if found is None:
        raise UserError(
            f"data.tokenizer={location} holds no {MODEL_FILE}; give the file, the folder of shards it is in, "
            "or the run directory whose export holds it"
        )
    with FileSystems.open(found) as handle:
        model_bytes = handle.read()
    try:
        loaded = processor(model_bytes)
    except RuntimeError:
        raise UserError(f"data.tokenizer: {found} is not a SentencePiece model") from None
    if (loaded.pad_id(), loaded.unk_id()) != (PAD_ID, UNK_ID):
        raise UserError(
            f"data.tokenizer: {found} has padding id {loaded.pad_id()} and unknown id {loaded.unk_id()}, not "
            f"{PAD_ID} and {UNK_ID}; give a tokenizer this project's preprocessing trained"
        )
    if end_of_document and loaded.eos_id() != EOS_ID:
        raise UserError(
            f"data.tokenizer: {found} has no end-of-document id ({EOS_ID}), which a next-token model predicts; "
            "share one trained for next-token data (with that id) instead, or leave data.tokenizer empty to train one"
        )
    return model_bytes


def _is_file(filesystems, path: str) -> bool:
    """Whether `path` is a file: a local one (not a folder), or an object in a bucket (a bucket has
    no folders: a prefix is not an object)."""
    if "://" not in path:
        return os.path.isfile(path)
    try:
        return filesystems.exists(path)
    except Exception:  # noqa: BLE001 - a malformed path or an unreachable bucket: not this candidate
        return False


def fit_or_share(train_texts: Sequence[str], data_config, end_of_document: bool = False) -> bytes:
    """The tokenizer preprocessing encodes with: `data.tokenizer`'s when set (`shared`), else one
    trained on the train split (`fit`)."""
    if data_config.tokenizer:
        return shared(data_config.tokenizer, end_of_document)
    return fit(train_texts, data_config.vocab_size, data_config.tokenizer_sample, end_of_document)


# ----------------------------------------------------------------------------- tokenizing

_processors: dict = {}
_last: tuple = (None, None)
"""(model bytes object, processor) of the last call: hashing the model costs more than
tokenizing a text, and encode() passes the same bytes object for every example. One tuple,
replaced whole, so that threads of one worker never pair one model's bytes with another's processor."""


def processor(model_bytes: bytes):
    """A SentencePieceProcessor for these model bytes, loaded once per process and model."""
    import sentencepiece as spm

    global _last
    last_bytes, last_processor = _last
    if model_bytes is last_bytes:
        return last_processor
    # Keyed by the model's sha256 so that Beam workers, which may hand over a fresh copy of the
    # artifact bytes per bundle, still load each model only once.
    key = sha256(model_bytes)
    loaded = _processors.get(key)
    if loaded is None:
        if len(_processors) >= 4:  # a long-lived worker may see several runs' models
            _processors.clear()
        loaded = spm.SentencePieceProcessor()
        loaded.LoadFromSerializedProto(model_bytes)
        _processors[key] = loaded
    _last = (model_bytes, loaded)
    return loaded


def vocab_size(model_bytes: bytes) -> int:
    """The number of pieces the trained model actually has (may be below `data.vocab_size`)."""
    return processor(model_bytes).GetPieceSize()


def tokenize(model_bytes: bytes, text: str) -> list[int]:
    """All ids of `text`, untruncated."""
    return list(processor(model_bytes).EncodeAsIds(text))


def tokenize_or_reject(model_bytes: bytes, text: str) -> list[int]:
    """The ids of a raw text; `Rejected('empty')` when it has none (e.g. only characters that
    normalisation removes), as preprocessing counts it."""
    ids = tokenize(model_bytes, text)
    if not ids:
        raise Rejected("empty", "no tokens after tokenization")
    return ids
