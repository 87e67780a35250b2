"""The `data:`, `model:` and `predict:` keys of the language model, beside the text tasks' shared ones
(../text/config.py) and every task's (the core's config.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..text.config import TextDataConfig, TextModelConfig


@dataclass(frozen=True)
class LanguageModelDataConfig(TextDataConfig):
    seq_len: int = 128
    """Inputs per packed window: preprocessing concatenates the documents (each ending in the
    end-of-document id) and cuts them into windows of this many tokens, the targets shifted by one.
    A multiple of 128 on a TPU."""

    max_document_windows: int = 0
    """A document keeps at most this many windows of tokens (its first max_document_windows x
    seq_len), so that one long document (a page of repeated text on one line) cannot become most of
    the windows; 0 keeps every document whole. Preprocessing reports the largest documents' share of
    the tokens and flags one over data.max_example_share."""

    min_seq_len: ClassVar[int] = 2  # a window needs a token to read and the next one to predict

    def problem(self) -> str | None:
        if self.max_document_windows < 0:
            return f"data.max_document_windows must be 0 (no cap) or more, got {self.max_document_windows}"
        return super().problem()


@dataclass(frozen=True)
class LanguageModelConfig(TextModelConfig):
    tie_embeddings: bool = True
    """Score the next token with the input embedding table (transposed) instead of a separate
    output layer: fewer parameters, and usually as good for a small model."""


@dataclass(frozen=True)
class LanguageModelPredictConfig:
    max_new_tokens: int = 24
    """Tokens the export generates per prompt (`make predict`). The export is written at the end of
    `make train`: `make train ARGS=predict.max_new_tokens=48` on a finished run writes it again."""
    temperature: float = 0.7
    """Above 0 samples from the softmax of logits / temperature; 0 picks the likeliest next token
    (greedy). Greedy decoding of a small model trained for minutes on real text repeats itself ("the
    the the ..."): sampling is the default, reproducible by its seed."""
    top_k: int = 40
    """When sampling, only among the k likeliest tokens (the unlikely tail stays out); 0 for all."""
    seed: int = 0
    """Seed of the sampling (the same prompt and seed give the same continuation)."""

    def problem(self) -> str | None:
        if self.max_new_tokens < 1:
            return f"predict.max_new_tokens must be at least 1, got {self.max_new_tokens}"
        if self.temperature < 0:
            return f"predict.temperature must be 0 (greedy) or more, got {self.temperature}"
        if self.top_k < 0:
            return f"predict.top_k must be 0 (all tokens) or more, got {self.top_k}"
        return None
