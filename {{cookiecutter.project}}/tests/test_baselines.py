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


def test_the_prior_decides_between_the_likelihoods_hand_counted_bounds():
    """Where the words favour class 1 by less than the log prior favours class 0 (ln 4/3 = 0.288),
    class 0 wins; by more, class 1. [0, 0.25]: 0.25 ln((7/12) / (1/5)) = 0.268 < 0.288: class 0;
    [6, 4]: 6 ln((5/12) / (4/5)) + 4 ln((7/12) / (1/5)) = 0.368 > 0.288: class 1. A prior smoothed
    by 2 (ln 5/4 = 0.223) or not at all (ln 3/2 = 0.405) puts one of them on the other side."""
    assert naive_bayes([([0, 0.25], 0), ([6, 4], 1)]) == {"majority": 0.5, "nb": 1.0}


def test_both_linear_baselines_agree_with_a_whole_split_count_on_every_example():
    """On random data in many batches (naive Bayes: sparse counts of 10 words, so that the smoothing
    matters; the ridge: 3 features, one a near-copy of another, so that the ridge matters), each
    model's decision on 300 eval examples against the same model counted on the whole train split
    at once, by its definition: the eval labels are that count's decisions, so the accuracy is 1
    exactly when every decision agrees. The majority class counts every batch."""
    rng = np.random.default_rng(0)
    counts = rng.poisson(0.3, size=(40, 10)).astype(np.float32)
    labels = (counts[:, :5].sum(axis=1) + rng.normal(0, 1, 40) > counts[:, 5:].sum(axis=1)).astype(int)
    probes = rng.poisson(0.5, size=(300, 10)).astype(np.float32)
    prior = np.bincount(labels, minlength=2)
    words = np.array([counts[labels == c].sum(axis=0) for c in range(2)])
    likelihood = (words + 1) / (words.sum(axis=1, keepdims=True) + 10)  # add-one over the 10 words
    decided = (probes @ np.log(likelihood).T + np.log((prior + 1) / (len(labels) + 2))).argmax(axis=1)
    found = linear_baselines(
        batches(list(zip(counts, labels)), 7), batches(list(zip(probes, decided)), 7), 2, lambda x: x, "naive_bayes"
    )
    assert found["naive_bayes"] == 1.0 and found["majority"] == np.mean(decided == prior.argmax())

    x = rng.normal(size=(120, 2))
    x = np.hstack([x, x[:, :1] + rng.normal(0, 0.01, (120, 1))]).astype(np.float32)
    labels = (x[:, 0] - x[:, 1] + rng.normal(0, 0.5, 120) > 0).astype(int)
    probes = rng.normal(size=(300, 3)).astype(np.float32)
    with_bias = np.hstack([x, np.ones((120, 1))])
    gram = with_bias.T @ with_bias
    ridge = 1e-3 * np.trace(gram) / 4  # 1e-3 of the mean diagonal
    weights = np.linalg.solve(gram + ridge * np.eye(4), with_bias.T @ np.eye(2)[labels])
    decided = (np.hstack([probes, np.ones((300, 1))]) @ weights).argmax(axis=1)
    found = linear_baselines(
        batches(list(zip(x, labels)), 7), batches(list(zip(probes, decided)), 7), 2, lambda v: v, "ridge"
    )
    assert found["ridge"] == 1.0


def test_the_majority_class_counts_every_batch_of_both_splits():
    """Train labels 0, 0 in the first batch, then 1, 1, 1: the majority is 1, not the first batch's
    0; eval labels 1, 1, 0, 1 in two batches: 3 of 4."""
    rows = [([0.0], 0), ([0.0], 0), ([0.0], 1), ([0.0], 1), ([0.0], 1)]
    evaluation = [([0.0], 1), ([0.0], 1), ([0.0], 0), ([0.0], 1)]
    assert linear_baselines(batches(rows), batches(evaluation), 2) == {"majority": 0.75}


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


def test_scores_are_kept_to_four_places_an_empty_split_has_none_and_only_a_tasks_own_reader_has_a_window(tmp_path):
    """Scores are rounded to 4 places, non-finite ones left out, other metrics kept apart; a split
    without records gives no baselines; the window the model reads is reported only for a task with a
    `baseline_batch` of its own (the contract's default reads the model's window itself)."""
    import tensorflow as tf

    from {{ cookiecutter.package }}.core.task import Task

    class Scored(OneFeature):
        def score_baselines(self, train, evaluation, manifest):
            return {"third": {"accuracy": 1 / 3, "loss": 2 / 3}, "broken": float("nan")}

    with tf.io.TFRecordWriter(str(tmp_path / "train.tfrecord")) as writer:
        writer.write(OneFeature.record(1.0, 1))
    with tf.io.TFRecordWriter(str(tmp_path / "eval.tfrecord")) as writer:
        writer.write(OneFeature.record(0.0, 0))
    counts = {"train": 1, "eval": 1}
    manifest = {"splits": {split: {"files": [f"{split}.tfrecord"], "num_examples": n} for split, n in counts.items()}}
    found = baselines.compute(Scored(), manifest, str(tmp_path))
    assert found["scores"] == {"third": 0.3333} and found["other_metrics"] == {"loss": {"third": 0.6667}}
    for empty in ("train", "eval"):
        manifest["splits"][empty]["num_examples"] = 0
        assert baselines.compute(Scored(), manifest, str(tmp_path)) is None
        manifest["splits"][empty]["num_examples"] = 1
    stats = {"length_stats": {"share_truncated": 0.5, "mean_kept": 0.25}, "seq_len": 8}
    window = {"window": {"seq_len": 8, "share_truncated": 0.5, "mean_kept": 0.25}}
    assert baselines.window_of(Scored(), stats) == window
    assert baselines.window_of(Scored(), {"seq_len": 8}) == {}

    class DefaultReader(Scored):
        baseline_batch = Task.baseline_batch

    assert baselines.window_of(DefaultReader(), stats) == {}


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


def test_other_metrics_are_described_and_kept_and_without_a_value_or_a_baseline_there_is_no_verdict():
    lower = {
        "higher_is_better": False,
        "scores": {"unigram": 300.0, "bigram": 70.0},
        "other_metrics": {"accuracy": {"unigram": 0.06, "bigram": 0.18}},
    }
    assert baselines.describe(lower) == (
        "baselines: unigram 300.0000, bigram 70.0000; accuracy: unigram 0.0600, bigram 0.1800"
    )
    assert baselines.summary(71.0, lower) == {
        "baselines": {"unigram": 300.0, "bigram": 70.0},
        "baselines_other_metrics": {"accuracy": {"unigram": 0.06, "bigram": 0.18}},
        "best_baseline": "bigram",
        "beats_best_baseline": False,
    }
    plain = {"higher_is_better": True, "scores": {"majority": 0.4}}
    assert baselines.summary(0.5, plain) == {
        "baselines": {"majority": 0.4},
        "best_baseline": "majority",
        "beats_best_baseline": True,
    }
    for nothing in (None, {}, {"higher_is_better": True, "scores": {}}):
        assert baselines.summary(0.5, nothing) == {} and baselines.describe(nothing) == ""
        assert baselines.best(nothing) is None and baselines.beats(0.5, nothing) is None
    assert baselines.beats(None, plain) is None and baselines.beats(float("nan"), plain) is None
    assert baselines.beats(70.0, lower) is True and baselines.beats(70.01, lower) is False  # a tie beats it


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
