"""The text tasks' shared `make doctor` rules: sequence length and vocabulary against the TPU's tiles.

Each rule is a pure function of (cfg, target, manifest) -> (status, message, fix): `status` is
"pass", "warn", "fail" or "skip"; `fix` is empty for a pass. `target.kind` is "tpu", "gpu" or
"cpu" (None counts as not a TPU); `manifest` is None before preprocessing.
"""

from __future__ import annotations

MXU_TILE = 128  # the MXU multiplies 128x128 tiles
SMALL_TILE = 8  # XLA pads the second-to-last dimension of every tensor to a multiple of 8


def on_tpu(target) -> bool:
    return getattr(target, "kind", None) == "tpu"


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def seq_len_tiles(cfg, target, manifest):
    """The sequence dimension becomes the rows of every attention and dense matmul: on a TPU a
    length off the 128 grid wastes the padded part of each tile on every layer."""
    seq_len = cfg.data.seq_len
    if not on_tpu(target):
        return "skip", f"data.seq_len {seq_len}: tile rules apply on a TPU only", ""
    fix = f"set data.seq_len={max(MXU_TILE, round_up(seq_len, MXU_TILE))} and re-run `make preprocess`"
    if seq_len % SMALL_TILE:
        return "fail", f"data.seq_len {seq_len} is not a multiple of {SMALL_TILE}: XLA pads every sequence tensor", fix
    if seq_len % MXU_TILE:
        return "warn", f"data.seq_len {seq_len} is not a multiple of {MXU_TILE}: part of each MXU tile is padding", fix
    return "pass", f"data.seq_len {seq_len} is a multiple of {MXU_TILE}", ""


def embedding_rows(cfg, target, manifest):
    """The embedding table covers the trained vocabulary in whole 128-row tiles."""
    from .layers import EMBEDDING_ROW_MULTIPLE
    from .layers import embedding_rows as rows_for

    vocab = (manifest or {}).get("vocab_size") or cfg.data.vocab_size
    rows = rows_for(vocab)
    where = "the tokenizer's" if manifest else "data.vocab_size (no manifest yet)"
    if rows < vocab or rows % EMBEDDING_ROW_MULTIPLE:
        return (
            "fail",
            f"embedding table of {rows} rows for {vocab} pieces ({where})",
            "make the task's model.py size the table with text/layers.py's embedding_rows(vocab_size)",
        )
    if manifest and vocab > cfg.data.vocab_size:
        return (
            "warn",
            (
                f"the shards' tokenizer has {vocab} pieces but data.vocab_size is {cfg.data.vocab_size}: "
                f"the config changed since preprocessing"
            ),
            f"set data.vocab_size={vocab}, or re-run `make preprocess` to train a tokenizer of the new size",
        )
    return "pass", f"embedding table of {rows} rows for {vocab} pieces ({where}): whole MXU tiles", ""
