"""The trivial baselines against answers worked out by hand, on small examples that no model gets
entirely right (the same inputs with both labels), fitted on the train split and scored on the eval
split: a baseline that drops a term, normalises over the wrong axis or scores the data it was fitted
on gives another number here."""

from __future__ import annotations

import numpy as np

from {{ cookiecutter.package }}.core import baselines
from {{ cookiecutter.package }}.tasks.classification import linear_baselines


def batches(rows, size: int = 2):
    """(features, labels) numpy batches of `size` rows from (features, label) pairs."""
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        yield np.array([features for features, _ in chunk], np.float32), np.array([label for _, label in chunk])


# Counts of two words. Train: class 0 [3, 0], [0, 0], [0, 0]; class 1 [2, 3] twice.
NB_TRAIN = [([2, 3], 1), ([3, 0], 0), ([0, 0], 0), ([2, 3], 1), ([0, 0], 0)]
# [0, 2] comes with both labels: at most 3 of 4 are right.
NB_EVAL = [([0, 2], 1), ([0, 2], 0), ([3, 2], 0), ([3, 1], 0)]


def naive_bayes(evaluation) -> dict:
    return linear_baselines(batches(NB_TRAIN), batches(evaluation), 2, lambda x: x, "naive_bayes", "nb")


def test_naive_bayes_against_a_hand_count():
    """Priors (add-one): class 0 (3+1)/(5+2) = 4/7, class 1 3/7. Word counts per class: [3, 0] and
    [4, 6], so p(word | 0) = [4/5, 1/5] and p(word | 1) = [5/12, 7/12] (add-one over the two words).
    Eval, log score of class 0 against class 1:
      [0, 2]: 2 ln(1/5) + ln(4/7) = -3.78 < 2 ln(7/12) + ln(3/7) = -1.92: class 1 (right once of twice)
      [3, 2]: 3 ln(4/5) + 2 ln(1/5) + ln(4/7) = -4.45 > 3 ln(5/12) + 2 ln(7/12) + ln(3/7) = -4.55: class 0,
              where the prior decides (without it, -3.89 < -3.70: class 1)
      [3, 1]: -2.84 > -4.01: class 0
    3 of 4 right; the majority class (0) gets 3 of 4 too. On its own train split it would score 1.0."""
    assert naive_bayes(NB_EVAL) == {"majority": 0.75, "nb": 0.75}


def test_naive_bayes_text_by_text():
    """The texts of the hand count one at a time, each right or wrong as worked out above; normalised
    over the classes instead of the words (p(word 0 | class) = [4/9, 5/9], p(word 1 | class) = [1/8,
    7/8]), [3, 2] and [3, 1] would go to class 1."""
    assert naive_bayes([([0, 2], 1)])["nb"] == 1.0
    assert naive_bayes([([0, 2], 0)])["nb"] == 0.0
    assert naive_bayes([([3, 2], 0)])["nb"] == 1.0, "the log prior decides [3, 2]"
    assert naive_bayes([([3, 1], 0)])["nb"] == 1.0
    # [1, 0]: ln(4/5) + ln(4/7) = -0.78 > ln(5/12) + ln(3/7) = -1.72
    assert naive_bayes([([1, 0], 0)]) == {"majority": 1.0, "nb": 1.0}


# One feature; train x = 0, 1, 2, 3 with labels 0, 0, 1, 1, and x = 1 labelled 1 as well.
RIDGE_TRAIN = [([0.0], 0), ([1.0], 0), ([2.0], 1), ([3.0], 1), ([1.0], 1)]
RIDGE_EVAL = [([0.5], 0), ([1.0], 0), ([1.0], 1), ([1.5], 1), ([2.5], 0)]


def test_the_linear_model_against_a_hand_count():
    """Least squares of the one-hot targets on [x, 1] (the ridge, 1e-3 of the mean diagonal, moves
    nothing here): class 1's indicator fits 0.6 + (1.8 / 5.2) (x - 1.4), above 0.5 from x = 1.11 on.
    Eval: 0.5 -> 0 (right), 1.0 -> 0 (right once of twice), 1.5 -> 1 (right), 2.5 -> 1 (wrong): 3 of 5.
    The majority class of the train split (1) gets 2 of 5; on the train split the model gets 4 of 5."""
    found = linear_baselines(batches(RIDGE_TRAIN), batches(RIDGE_EVAL), 2, lambda x: x, "ridge", "linear")
    assert found == {"majority": 0.4, "linear": 0.6}


class OneFeature:
    """The least a task gives core/baselines.py: records of one float `x` and a `label`, read back as
    (x [B, 1], label [B]), and the linear model above on them."""

    headline_metric, higher_is_better = "accuracy", True

    @staticmethod
    def record(x: float, label: int) -> bytes:
        import tensorflow as tf

        feature = {
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[x])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    def baseline_batch(self, serialized, manifest):
        import tensorflow as tf

        spec = {"x": tf.io.FixedLenFeature([1], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}
        parsed = tf.io.parse_example(serialized, spec)
        return parsed["x"], parsed["label"]

    def score_baselines(self, train, evaluation, manifest):
        return linear_baselines(train, evaluation, 2, lambda x: x, "ridge", "linear")


def test_the_baselines_of_the_shards_are_fitted_on_train_and_scored_on_eval(tmp_path):
    """core/baselines.py on written shards: fitted on the train files, scored on the eval files (the
    hand count above: 0.6; the train split would say 0.8), with how many records each read."""
    import tensorflow as tf

    task = OneFeature()
    for split, rows in (("train", RIDGE_TRAIN), ("eval", RIDGE_EVAL)):
        with tf.io.TFRecordWriter(str(tmp_path / f"{split}-00000-of-00001.tfrecord")) as writer:
            for features, label in rows:
                writer.write(task.record(features[0], label))
    manifest = {
        "splits": {
            split: {"files": [f"{split}-00000-of-00001.tfrecord"], "num_examples": len(rows)}
            for split, rows in (("train", RIDGE_TRAIN), ("eval", RIDGE_EVAL))
        },
        "compression": "none",
    }
    found = baselines.compute(task, manifest, str(tmp_path))
    assert found == {
        "metric": "accuracy",
        "higher_is_better": True,
        "scores": {"majority": 0.4, "linear": 0.6},
        "train_records": 5,
        "eval_records": 5,
    }


def test_the_best_baseline_and_the_verdict():
    found = {"higher_is_better": True, "scores": {"majority": 0.4, "linear": 0.6}}
    assert baselines.best(found) == ("linear", 0.6)
    assert baselines.beats(0.6, found) is True and baselines.beats(0.59, found) is False
    lower = {"higher_is_better": False, "scores": {"unigram": 300.0, "bigram": 70.0}}
    assert baselines.best(lower) == ("bigram", 70.0) and baselines.beats(69.0, lower) is True
    assert baselines.describe(found) == "baselines: majority 0.4000, linear 0.6000"
    window = {"seq_len": 128, "share_truncated": 0.97, "mean_kept": 0.2223}
    assert baselines.describe({**found, "window": window}) == (
        "baselines: majority 0.4000, linear 0.6000 on whole inputs (the model's window of 128 keeps 22% of "
        "their tokens, 97% of inputs truncated)"
    )


{%- if cookiecutter.task == "image_classification" %}


def test_the_pixel_baseline_against_the_same_hand_count():
    """The image task's baseline is the linear model above on the 8x8 block means of each channel:
    uniform 8x8 images of intensity x / 3 give it x on every one of their 192 features, and the same
    answers."""
    from {{ cookiecutter.package }}.tasks.image_classification import TASK

    def images(rows):
        for features, labels in batches(rows):
            yield np.ones((len(labels), 8, 8, 3), np.float32) * (features[:, :1, None, None] / 3.0), labels

    found = TASK.score_baselines(images(RIDGE_TRAIN), images(RIDGE_EVAL), {"num_classes": 2})
    assert found == {"majority": 0.4, "linear-8x8-pixels": 0.6}


{%- endif %}
{%- if cookiecutter.task == "language_model" %}


def test_the_bigram_baseline_against_a_hand_count():
    """Vocabulary of 4 (0 is padding). Train pairs (input -> target): 1->2, 2->1, 1->2, 2->3, 1->3;
    targets 2, 1, 2, 3, 3 give the add-one unigram [1, 2, 3, 3] / 9. Context 1 was seen 3 times with
    2 distinct next tokens: Witten-Bell keeps 3 / (3 + 2) of the weight on its counts; context 2,
    2 times with 2: 2 / 4. Eval pairs:
      1->2: 3/5 * 2/3 + 2/5 * 3/9 = 8/15
      2->2: 2/4 * 0 + 2/4 * 3/9 = 1/6   (never seen after 2)
      3->1: context 3 never seen: the unigram's 2/9
    bigram perplexity exp(-(ln 8/15 + ln 1/6 + ln 2/9) / 3); unigram exp(-(ln 3/9 + ln 3/9 + ln 2/9) / 3).
    Accuracy, each model's likeliest next token against the target: the unigram's is 2 (tied with 3
    at 3/9, the lower id), right for 2 of 3; the bigram's after 1 is 2 (8/15 against 3's 5/15, right),
    after 2 is 3 (15/36, against 1's 13/36 and the unseen 2's 6/36: wrong), after the unseen 3 the
    unigram's 2 (wrong): 1 of 3. The padding (target 0) counts for neither."""
    import math

    import pytest

    from {{ cookiecutter.package }}.tasks.language_model.objective import ngram_baselines

    def batch(inputs, targets):
        return {"inputs": np.array([inputs], np.int32)}, np.array([targets], np.int32)

    train = [batch([1, 2, 1, 2, 1, 0], [2, 1, 2, 3, 3, 0])]
    evaluation = [batch([1, 2], [2, 2]), batch([3, 3], [1, 0])]
    found = ngram_baselines(iter(train), iter(evaluation), 4)
    bigram = math.exp(-(math.log(8 / 15) + math.log(1 / 6) + math.log(2 / 9)) / 3)
    unigram = math.exp(-(2 * math.log(3 / 9) + math.log(2 / 9)) / 3)
    assert found["unigram"]["perplexity"] == pytest.approx(unigram, rel=1e-9)
    assert found["bigram"]["perplexity"] == pytest.approx(bigram, rel=1e-9)
    assert found["unigram"]["accuracy"] == pytest.approx(2 / 3) and found["bigram"]["accuracy"] == pytest.approx(1 / 3)


{%- endif %}
