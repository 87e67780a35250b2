"""The text classifier's model keys: the shared Transformer's, and how it pools the tokens."""

from __future__ import annotations

from dataclasses import dataclass

from ..text.config import TextModelConfig

POOLINGS = ("mean", "max", "mean_max")


@dataclass
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
