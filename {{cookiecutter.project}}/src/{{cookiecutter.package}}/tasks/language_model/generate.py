"""What the export serves: a continuation of each prompt, generated inside the SavedModel.

Shapes stay static, as a TPU server needs: the prompt sits in a window of `seq_len` tokens (the last
`seq_len` when longer) and every step runs the whole window through the model, reads the logits at
the last real position and writes the chosen token after it; a full window shifts left by one.
Greedy (temperature 0) picks the likeliest token; otherwise it samples from the softmax of
logits / temperature, among the `top_k` likeliest when top_k > 0, with a fixed seed. A row's draw
depends only on its own logits, the seed and the step, so a prompt's continuation is the same
whichever other prompts share its batch.

A production decoder would keep a KV cache (each step attends the new token to the stored keys and
values of the earlier ones instead of recomputing the window) and stop a row at its end-of-document
token; here a row simply keeps going, and `predictions` cuts the text at the first one.
"""

from __future__ import annotations

import tensorflow as tf

from ..text.tokenizer import EOS_ID, PAD_ID, UNK_ID


def window_features(window, lengths, seq_len: int) -> dict:
    """The model's features for windows holding one document each in their first `lengths` positions."""
    real = tf.range(seq_len)[None, :] < lengths[:, None]
    segment_ids = tf.cast(real, tf.int32)
    return {"inputs": window, "segment_ids": segment_ids, "positions": tf.range(seq_len)[None, :] * segment_ids}


def next_token_logits(model, window, lengths, seq_len: int, vocab_size: int):
    """float32 [B, vocab_size]: the logits after the last real token of each window; padding and
    the unknown piece are never chosen."""
    logits = model(window_features(window, lengths, seq_len), training=False)
    last = tf.gather(logits, lengths - 1, batch_dims=1)[:, :vocab_size]
    banned = tf.one_hot([PAD_ID, UNK_ID], vocab_size, on_value=True, off_value=False, dtype=tf.bool)
    return tf.where(tf.reduce_any(banned, axis=0)[None, :], tf.float32.min, tf.cast(last, tf.float32))


def prompt_log_likelihood(model, window, lengths, seq_len: int):
    """float32 [B]: sum of log p(token | the tokens before it) over each prompt's tokens after its first."""
    logits = tf.cast(model(window_features(window, lengths, seq_len), training=False), tf.float32)
    targets = tf.concat([window[:, 1:], tf.fill([tf.shape(window)[0], 1], PAD_ID)], axis=1)
    has_target = tf.range(seq_len)[None, :] < lengths[:, None] - 1
    log_p = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    return tf.reduce_sum(tf.where(has_target, log_p, 0.0), axis=1)


def choose(logits, step, temperature: float, top_k: int, seed: int):
    """int32 [B]: the next token of each row."""
    if temperature <= 0:
        return tf.argmax(logits, axis=-1, output_type=tf.int32)
    if top_k > 0:
        kth = tf.math.top_k(logits, k=min(top_k, logits.shape[-1])).values[:, -1:]
        logits = tf.where(logits < kth, tf.float32.min, logits)
    # Gumbel-max: the argmax of logits / temperature plus Gumbel noise is a draw from their softmax.
    # One noise vector per step, shared by the rows (tf.random.stateless_categorical would draw each
    # row's noise by its index in the batch, so a prompt's continuation would change with the
    # prompts before it).
    uniform = tf.random.stateless_uniform(
        tf.shape(logits)[-1:],
        seed=tf.stack([seed, step]),
        minval=1e-30,
        maxval=1.0,  # above 0: log(0) is -inf
    )
    gumbel = -tf.math.log(-tf.math.log(uniform))
    return tf.argmax(logits / temperature + gumbel[None, :], axis=-1, output_type=tf.int32)


def generate(
    model,
    window,
    lengths,
    *,
    seq_len: int,
    vocab_size: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    seed: int,
):
    """int32 [B, max_new_tokens]: the tokens generated after each prompt."""
    batch = tf.shape(window)[0]
    rows = tf.range(batch)

    def step(index, window, lengths, generated):
        token = choose(next_token_logits(model, window, lengths, seq_len, vocab_size), index, temperature, top_k, seed)
        full = lengths >= seq_len
        window = tf.where(full[:, None], tf.roll(window, -1, axis=1), window)
        lengths = tf.minimum(lengths + 1, seq_len)
        window = tf.tensor_scatter_nd_update(window, tf.stack([rows, lengths - 1], axis=1), token)
        return index + 1, window, lengths, generated.write(index, token)

    generated = tf.TensorArray(tf.int32, size=max_new_tokens, element_shape=tf.TensorShape([None]))
    _, _, _, generated = tf.while_loop(
        lambda index, *_: index < max_new_tokens, step, (tf.constant(0), window, lengths, generated)
    )
    return tf.transpose(generated.stack())


def prompt_window(ids: list[int], seq_len: int) -> tuple[list[int], int]:
    """(the window of a prompt's ids, its length): the last seq_len ids, or the end-of-document id
    for an empty prompt (what a document's first token follows in training)."""
    ids = list(ids)[-seq_len:] or [EOS_ID]
    return ids + [PAD_ID] * (seq_len - len(ids)), len(ids)
