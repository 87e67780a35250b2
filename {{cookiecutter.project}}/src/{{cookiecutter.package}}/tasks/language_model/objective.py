"""The language model's objective: next-token cross entropy on the positions that have a target.

The core weights evaluation per window (the padding windows that make the last steps whole weigh 0);
within a window, the target 0 marks a position without a target. So the metrics here multiply the
window's weight by the per-token mask and sum over tokens: `perplexity` is exp(sum of cross entropy /
number of real targets), the same whatever the batch size or the number of replicas.
"""

from __future__ import annotations

import math

import tensorflow as tf

from ...core.keras import keras
from ..text.tokenizer import PAD_ID


def token_mask(targets):
    return tf.cast(tf.not_equal(targets, PAD_ID), tf.float32)


class TokenCrossEntropy(keras.losses.Loss):
    """Per-token cross entropy [B, S], 0 where there is no target. The training loss is its mean
    over all positions; only a shard's last window has positions without a target."""

    def call(self, targets, logits):
        targets = tf.cast(targets, tf.int32)
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=tf.cast(logits, tf.float32))
        return xent * token_mask(targets)


class TokenMetric(keras.metrics.Metric):
    """A token-weighted mean over the real targets: `perplexity` (exp of the mean cross entropy) or
    `accuracy` (share of targets that are the likeliest token)."""

    KINDS = ("perplexity", "accuracy")

    def __init__(self, kind: str, name: str | None = None, **kwargs):
        super().__init__(name=name or kind, **kwargs)
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        self.kind = kind
        self.total = self.add_weight(name="total", initializer="zeros", dtype=tf.float32)
        self.count = self.add_weight(name="count", initializer="zeros", dtype=tf.float32)

    def update_state(self, targets, logits, sample_weight=None):
        targets = tf.cast(targets, tf.int32)
        logits = tf.cast(logits, tf.float32)
        weight = token_mask(targets)
        if sample_weight is not None:
            weight *= tf.reshape(tf.cast(sample_weight, tf.float32), [-1, 1])
        if self.kind == "perplexity":
            value = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
        else:
            value = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), targets), tf.float32)
        self.total.assign_add(tf.reduce_sum(value * weight))
        self.count.assign_add(tf.reduce_sum(weight))

    def result(self):
        mean = tf.math.divide_no_nan(self.total, self.count)
        return tf.exp(mean) if self.kind == "perplexity" else mean

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "kind": self.kind}


def ngram_baselines(train, evaluation, vocab_size: int) -> dict[str, dict[str, float]]:
    """Eval perplexity and accuracy of two count models of the train targets, over the same targets
    the metrics count: `unigram` (each token's frequency, add-one smoothed: no context) and `bigram`
    (the next token's frequency after the current input token, interpolated with the unigram by
    Witten-Bell: a context seen c times with t distinct next tokens keeps c / (c + t) of the weight).
    Accuracy: how often each model's likeliest next token is the target (the unigram's is the most
    frequent train token everywhere; the bigram's the likeliest of its interpolation)."""
    import numpy as np

    unigram, keys = np.zeros(vocab_size), []
    for features, targets in train:
        mask = targets != PAD_ID
        previous, current = features["inputs"][mask].astype(np.int64), targets[mask].astype(np.int64)
        unigram += np.bincount(current, minlength=vocab_size)
        keys.append(previous * vocab_size + current)
    pairs, pair_counts = np.unique(np.concatenate([np.zeros(0, np.int64), *keys]), return_counts=True)
    contexts = pairs // vocab_size
    context_counts = np.bincount(contexts, weights=pair_counts, minlength=vocab_size)
    followers = np.bincount(contexts, minlength=vocab_size)
    p_unigram = (unigram + 1.0) / (unigram.sum() + vocab_size)
    keep = np.divide(context_counts, context_counts + followers, out=np.zeros(vocab_size), where=context_counts > 0)
    # Each context's likeliest next token: among its seen followers, or the unigram's favourite.
    favourite = int(np.argmax(p_unigram))
    best_p = (1.0 - keep) * p_unigram[favourite]  # the favourite unseen after the context
    best_token = np.full(vocab_size, favourite)
    pair_contexts, pair_tokens = contexts, pairs % vocab_size
    pair_p = (
        keep[pair_contexts] * pair_counts / np.maximum(context_counts[pair_contexts], 1.0)
        + (1.0 - keep[pair_contexts]) * p_unigram[pair_tokens]
    )
    # Each seen context's best pair (likeliest, then the lowest token), against the unseen favourite.
    order = np.lexsort((pair_tokens, -pair_p, pair_contexts))
    first = order[np.r_[True, pair_contexts[order][1:] != pair_contexts[order][:-1]]] if len(order) else order
    context, token, p = pair_contexts[first], pair_tokens[first], pair_p[first]
    better = (p > best_p[context]) | ((p == best_p[context]) & (token < favourite))
    best_token[context[better]] = token[better]
    log_unigram = log_bigram = 0.0
    seen = right_unigram = right_bigram = 0
    for features, targets in evaluation:
        mask = targets != PAD_ID
        previous, current = features["inputs"][mask].astype(np.int64), targets[mask].astype(np.int64)
        key = previous * vocab_size + current
        at = np.searchsorted(pairs, key)
        found = at < len(pairs)
        found[found] = pairs[at[found]] == key[found]
        count = np.zeros(len(key))
        count[found] = pair_counts[at[found]]
        following = count / np.maximum(context_counts[previous], 1.0)
        bigram = keep[previous] * following + (1.0 - keep[previous]) * p_unigram[current]
        log_unigram += float(np.log(p_unigram[current]).sum())
        log_bigram += float(np.log(bigram).sum())
        right_unigram += int((current == favourite).sum())
        right_bigram += int((best_token[previous] == current).sum())
        seen += len(current)
    if not seen:
        return {}
    return {
        "unigram": {"perplexity": math.exp(-log_unigram / seen), "accuracy": right_unigram / seen},
        "bigram": {"perplexity": math.exp(-log_bigram / seen), "accuracy": right_bigram / seen},
    }
