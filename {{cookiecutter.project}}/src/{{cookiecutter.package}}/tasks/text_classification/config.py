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

    def problem(self) -> str | None:
        if self.pooling not in POOLINGS:
            return f"model.pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}"
        return None
