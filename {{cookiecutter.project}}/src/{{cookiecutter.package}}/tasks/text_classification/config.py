"""The text classifier's keys: the shared data and Transformer keys, how a long text is cut to the
window, and how the model pools the tokens."""

from __future__ import annotations

from dataclasses import dataclass

from ..text.config import TextDataConfig, TextModelConfig

POOLINGS = ("mean", "max", "mean_max")
TRUNCATIONS = ("head", "head_tail")
"""How a text longer than `data.seq_len` is cut: `head` keeps its first seq_len pieces; `head_tail`
its first seq_len // 2 and its last seq_len - seq_len // 2 (where news, reports and reviews put their
bylines, sign-offs and verdicts)."""


@dataclass(frozen=True)
class ClassifierDataConfig(TextDataConfig):
    truncation: str = "head"
    """Which pieces of a text longer than `data.seq_len` the model reads: `head`, the first seq_len;
    `head_tail`, the first half and the last half of the window (the byline, sign-off or verdict
    that ends a document). Preprocessing cuts the records so and `make predict` cuts its inputs the
    same way; the baselines read the whole text either way. `make doctor` shows how much it keeps."""

    def problem(self) -> str | None:
        if self.truncation not in TRUNCATIONS:
            return f"data.truncation must be one of {', '.join(TRUNCATIONS)}, got {self.truncation!r}"
        return super().problem()


@dataclass(frozen=True)
class ClassifierModelConfig(TextModelConfig):
    pooling: str = "mean"
    """How the tokens' representations become one per text: `mean` (masked mean over the real
    tokens), `max` (masked maximum of each feature) or `mean_max` (both, concatenated)."""
    bag_width: int = 0
    """Width of a bag-of-pieces path beside the Transformer (fastText): the mean embedding of a
    text's pieces and of its adjacent pairs of pieces, joined to the pooled features before the
    logits. Word counts and short phrases are what a small corpus teaches best; 0 leaves it out."""
    bag_buckets: int = 65536
    """Rows the adjacent pairs are hashed into when `bag_width` > 0 (a multiple of 128 on a TPU)."""

    def problem(self) -> str | None:
        if self.pooling not in POOLINGS:
            return f"model.pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}"
        if self.bag_width < 0:
            return f"model.bag_width must be 0 (off) or more, got {self.bag_width}"
        if self.bag_width and self.bag_buckets < 1:
            return f"model.bag_buckets must be at least 1 when model.bag_width is set, got {self.bag_buckets}"
        return None
