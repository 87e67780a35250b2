"""Reading the text tasks' raw input: `.txt` files (one text per file) and JSON Lines files (one JSON
object per line, with a string `text` and whatever else the task needs), local or gs://.

Bad inputs become `RawRejection`s with their source (`file.jsonl:LINE` for a line): an empty text,
bytes that are not UTF-8, a line that is not a JSON object, a missing field.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator, Sequence

from ...core.errors import UserError
from ...core.task import Manifest, RawExample, RawRejection

TEXT_SUFFIX = ".txt"
JSONL_SUFFIX = ".jsonl"
ASSETS_DIR = "assets.extra"
"""Where the core writes `export_assets` inside the export (the SavedModel convention for extra files)."""

REJECT_REASONS = {
    "empty": "empty text (nothing but whitespace, or no tokens)",
    "not_utf8": "not UTF-8: bytes that do not decode as UTF-8 text",
    "not_json": "a JSON Lines line that is not a JSON object",
}


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def decode(raw_bytes: bytes) -> str:
    # utf-8-sig: files saved by Windows editors start with a byte-order mark that is not text.
    return raw_bytes.decode("utf-8-sig")


def is_jsonl(relative: str) -> bool:
    return relative.lower().endswith(JSONL_SUFFIX)


def read_text_file(relative: str, raw_bytes: bytes, target) -> Iterator[RawExample | RawRejection]:
    """The one text of a `.txt` file, learning `target`."""
    try:
        text = decode(raw_bytes)
    except UnicodeDecodeError as error:
        yield RawRejection(relative, "not_utf8", f"{error.reason} at byte {error.start}")
        return
    if not text.strip():
        yield RawRejection(relative, "empty", "empty text")
        return
    yield RawExample(relative, target, text)


def read_jsonl(relative: str, raw_bytes: bytes, target_field: str | None) -> Iterator[RawExample | RawRejection]:
    """One example per line; `source` is `file.jsonl:LINE` (1-based). Blank lines are skipped.
    With `target_field`, each object must also hold that field as a non-empty string: the target."""
    if raw_bytes.startswith(b"\xef\xbb\xbf"):  # a byte-order mark before the first line
        raw_bytes = raw_bytes[3:]
    fields = ("text", target_field) if target_field else ("text",)
    for number, raw_line in enumerate(raw_bytes.split(b"\n"), 1):
        source = f"{relative}:{number}"
        if not raw_line.strip():
            continue
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as error:
            yield RawRejection(source, "not_utf8", f"{error.reason} at byte {error.start} of the line")
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            yield RawRejection(source, "not_json", f"invalid JSON ({error.msg}, column {error.colno})")
            continue
        if not isinstance(record, dict):
            yield RawRejection(source, "not_json", f"a JSON {type(record).__name__}, not an object")
            continue
        missing = [key for key in fields if not isinstance(record.get(key), str)]
        if missing:
            yield RawRejection(source, "missing_field", " and ".join(f"no string `{key}`" for key in missing))
            continue
        if not record["text"].strip():
            yield RawRejection(source, "empty", "empty text")
            continue
        if target_field and not record[target_field].strip():
            yield RawRejection(source, "missing_field", f"empty `{target_field}`")
            continue
        yield RawExample(source, record[target_field] if target_field else None, record["text"])


def check_shards(manifest: Manifest, data_config, data_dir: str, sequences: str) -> None:
    """The text tasks' check that the shards fit the config: the same `data.seq_len` (each record
    holds `sequences` of that many tokens) and the tokenizer they were written with."""
    from .tokenizer import MODEL_FILE

    written = manifest.get("seq_len")
    if written != data_config.seq_len:
        raise UserError(
            f"data.seq_len is {data_config.seq_len} but the shards in {data_dir} hold {sequences} of {written} tokens; "
            f"set data.seq_len={written}, or re-run `make preprocess ARGS=data.seq_len={data_config.seq_len}`"
        )
    read_tokenizer(data_dir, manifest, MODEL_FILE)


def read_tokenizer(data_dir: str, manifest: Manifest, model_file: str) -> bytes:
    """The tokenizer the shards were written with, checked against the manifest's sha256; a missing
    or replaced file is a one-line UserError."""
    import tensorflow as tf

    from .tokenizer import sha256

    facts = manifest.get("tokenizer") or {}
    path = join(data_dir, facts.get("file", model_file))
    if not tf.io.gfile.exists(path):
        raise UserError(f"the tokenizer {path} is missing beside the shards; re-run `make preprocess`")
    with tf.io.gfile.GFile(path, "rb") as handle:
        model_bytes = handle.read()
    if sha256(model_bytes) != facts.get("sha256"):
        raise UserError(
            f"shards and tokenizer do not match ({path} is not the tokenizer the shards were "
            f"written with); re-run `make preprocess`"
        )
    return model_bytes


def exported_tokenizer(export_dir: str, model_file: str) -> bytes:
    """The tokenizer an export carries in its assets; a one-line UserError when it has none."""
    import tensorflow as tf

    path = join(export_dir, ASSETS_DIR, model_file)
    if not tf.io.gfile.exists(path):
        raise UserError(
            f"the export {export_dir} has no {ASSETS_DIR}/{model_file}; "
            f"re-run `make train` to export the model with its tokenizer"
        )
    with tf.io.gfile.GFile(path, "rb") as handle:
        return handle.read()


def input_lines(inputs: Sequence[str], what: str) -> list[tuple[str, str]]:
    """(name, line) for every non-blank line of the INPUT files of `make predict`, the name being
    `file:LINE` and the line's start; `what` says what a line is (in errors)."""
    import tensorflow as tf

    lines = []
    for path in inputs:
        if not tf.io.gfile.exists(path):
            raise UserError(f"INPUT {path} does not exist; pass text files with one {what} per line")
        with tf.io.gfile.GFile(path, "rb") as handle:
            try:
                text = decode(handle.read())
            except UnicodeDecodeError:
                raise UserError(f"INPUT {path} is not UTF-8 text; save it as UTF-8, one {what} per line") from None
        found = [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        if not found:
            raise UserError(f"INPUT {path} has no text; write one {what} per line")
        lines += [(f"{posixpath.basename(path)}:{number} {line[:40]}", line) for number, line in found]
    return lines
