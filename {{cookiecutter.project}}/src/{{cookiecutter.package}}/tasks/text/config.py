"""The `data:` and `model:` keys the text tasks share (the keys of every task are in the core's config.py).

Every key is a dataclass field with its meaning; configs/*.yaml set them and `dotted.key=value`
overrides them, e.g. `data.seq_len=256`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...core import config as config_lib


@dataclass(frozen=True)
class TextDataConfig(config_lib.DataConfig):
    seq_len: int = 128
    """Static sequence length of every batch: preprocessing truncates texts to it and the input
    pipeline pads to it. A multiple of 128 on a TPU; `make doctor` shows how much is truncated."""
    vocab_size: int = 2000
    """SentencePiece vocabulary size trained by preprocessing (a small corpus may yield fewer)."""
    tokenizer_sample: int = 20000
    """At most this many train texts are used to train the tokenizer."""
    tokenizer: str = ""
    """A SentencePiece model to encode with instead of training one (then `vocab_size` and
    `tokenizer_sample` are not used): its file, the folder of shards it is in, or a run directory or
    its export. A fine-tune shares its pretraining's, so that its ids mean the pieces the
    loaded embeddings were trained on (`train.init_from` checks this). Empty: train one."""

    min_seq_len: ClassVar[int] = 1  # the shortest `seq_len` the task can use

    def problem(self) -> str | None:
        for key, value, least in (
            ("seq_len", self.seq_len, self.min_seq_len),
            ("vocab_size", self.vocab_size, 8),
            ("tokenizer_sample", self.tokenizer_sample, 1),
        ):
            if value < least:
                return f"data.{key} must be at least {least}, got {value}"
        return None


@dataclass(frozen=True)
class TextModelConfig:
    width: int = 64
    """Width of the token representation (embedding and attention); a multiple of 128 on a TPU."""
    depth: int = 2
    """Number of Transformer blocks."""
    heads: int = 2
    """Attention heads per block; `width` must divide evenly by it (on a TPU, width/heads of
    128 keeps each head's matrix multiply on full MXU tiles)."""
    mlp_width: int = 128
    """Hidden width of each block's feed-forward layer (usually 2-4 x width)."""
    dropout: float = 0.1
    """Dropout rate after attention, in the feed-forward layer and before the logits."""
    remat: bool = False
    """Recompute each Transformer block's activations in the backward pass instead of keeping them:
    the activations kept shrink to the blocks' inputs (`make doctor` shows by how much) for about a
    third more compute per step. A memory lever for models that do not fit; see core/recompute.py."""


def width_fix(config: TextModelConfig, quantum: int) -> str:
    """The config change that puts the Transformer's widths on multiples of `quantum` (doctor)."""

    def up(value: int) -> int:
        return max(quantum, -(-value // quantum) * quantum)

    return f"model.width={up(config.width)} model.mlp_width={up(config.mlp_width)}"
