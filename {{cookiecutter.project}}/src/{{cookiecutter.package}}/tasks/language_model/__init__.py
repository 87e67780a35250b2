"""Language model: unlabelled UTF-8 texts -> SentencePiece -> packed windows -> decoder-only Transformer."""

from .task import TASK

__all__ = ["TASK"]
