"""Text classification: UTF-8 texts (a folder per label, or JSON Lines) -> SentencePiece -> Transformer."""

from .task import TASK

__all__ = ["TASK"]
