"""Trivial baselines of the data: the scores a model must beat to have learned anything.

`make preprocess` fits the task's baselines (`Task.score_baselines`: the majority class, a bag-of-words or
pixel linear model, an n-gram model, the train mean) on the train split and scores them on the eval
split, in the task's headline metric (and in its other metrics where it scores them there), and
writes them into manifest.json. Training prints them
beside every evaluation and writes them into metrics.json; `make doctor` warns when the last run
did not beat the best one.

They read at most TRAIN_RECORDS train and EVAL_RECORDS eval records, interleaved over every shard,
through the task's `baseline_batch` (by default `parse_batch`, without augmentation: the inputs the
model sees), a few seconds of host work whatever the size of the data. A task whose model reads a
window of each input (the text classifier: the first data.seq_len pieces) fits them on the whole
input instead, and the window's coverage (from the manifest's `length_stats`) is printed beside
them: a baseline cut like the model would hide what the cut costs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

TRAIN_RECORDS = 100_000
EVAL_RECORDS = 50_000
BATCH = 1024


def batches(task, manifest: dict, data_dir: str, split: str, limit: int) -> Iterator:
    """(features, targets) numpy batches of at most `limit` records of a split, read across its shards."""
    import tensorflow as tf

    from .distribute import physical_devices

    physical_devices()  # TensorFlow's look at the devices, without the CUDA probe's line on a CPU machine
    files = [f"{data_dir.rstrip('/')}/{name}" for name in manifest["splits"][split]["files"]]
    compression = "GZIP" if manifest.get("compression") == "gzip" else ""
    records = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=compression),
        cycle_length=max(1, min(len(files), 16)),
    )
    parsed = records.take(limit).batch(BATCH).map(lambda serialized: task.baseline_batch(serialized, manifest))
    yield from parsed.as_numpy_iterator()


def compute(task, manifest: dict, data_dir: str) -> dict | None:
    """The task's baselines of these shards, as the manifest keeps them; None when it has none or a
    split is empty."""
    splits = manifest["splits"]
    if not splits["train"]["num_examples"] or not splits["eval"]["num_examples"]:
        return None
    scored = task.score_baselines(
        batches(task, manifest, data_dir, "train", TRAIN_RECORDS),
        batches(task, manifest, data_dir, "eval", EVAL_RECORDS),
        manifest,
    )
    # {name: score} in the headline metric, or {name: {metric: score}} in several (the headline among them).
    by_name = {
        name: value if isinstance(value, dict) else {task.headline_metric: value} for name, value in scored.items()
    }
    by_metric: dict[str, dict[str, float]] = {}
    for name, values in by_name.items():
        for metric, value in values.items():
            if math.isfinite(value):
                by_metric.setdefault(metric, {})[name] = round(float(value), 4)
    scores = by_metric.pop(task.headline_metric, {})
    if not scores:
        return None
    found = {
        "metric": task.headline_metric,
        "higher_is_better": task.higher_is_better,
        "scores": scores,
        **({"other_metrics": by_metric} if by_metric else {}),
        "train_records": min(splits["train"]["num_examples"], TRAIN_RECORDS),
        "eval_records": min(splits["eval"]["num_examples"], EVAL_RECORDS),
    }
    return {**found, **window_of(task, manifest)}


def window_of(task, manifest: dict) -> dict:
    """{'window': {'seq_len', 'share_truncated', 'mean_kept'}} when the baselines read whole inputs
    (the task's own `baseline_batch`) of which the model reads a window; else {}."""
    from .task import Task

    stats = manifest.get("length_stats") or {}
    # The task's own `baseline_batch` (its bound method's function), not the contract's default.
    own = getattr(getattr(task, "baseline_batch", None), "__func__", None)
    if own is None or own is Task.baseline_batch or "mean_kept" not in stats:
        return {}
    window = {"share_truncated": stats["share_truncated"], "mean_kept": stats["mean_kept"]}
    return {"window": {"seq_len": manifest.get("seq_len"), **window}}


def best(baselines: dict | None) -> tuple[str, float] | None:
    """(name, score) of the strongest baseline, or None."""
    if not baselines or not baselines.get("scores"):
        return None
    choose = max if baselines["higher_is_better"] else min
    return choose(baselines["scores"].items(), key=lambda item: item[1])


def beats(value: float, baselines: dict | None) -> bool | None:
    """Whether a model's headline `value` is at least as good as the best baseline (None: no baseline)."""
    strongest = best(baselines)
    if strongest is None or value is None or not math.isfinite(value):
        return None
    return value >= strongest[1] if baselines["higher_is_better"] else value <= strongest[1]


def describe(baselines: dict | None) -> str:
    """'baselines: majority 0.2300, bag-of-words 0.9700' (empty without any), then each other
    metric's: 'baselines: unigram 294.9000, bigram 89.8000; accuracy: unigram 0.0600, bigram 0.1800';
    where they read whole
    inputs of which the model sees a window, what that window keeps: 'baselines: ... on whole inputs
    (the model's window of 128 keeps 41% of their tokens, 87% of inputs truncated)'."""
    if not baselines or not baselines.get("scores"):
        return ""
    scores = ", ".join(f"{name} {value:.4f}" for name, value in baselines["scores"].items())
    for metric, values in (baselines.get("other_metrics") or {}).items():
        scores += f"; {metric}: " + ", ".join(f"{name} {value:.4f}" for name, value in values.items())
    window = baselines.get("window")
    if not window:
        return f"baselines: {scores}"
    return (
        f"baselines: {scores} on whole inputs (the model's window of {window['seq_len']} keeps "
        f"{window['mean_kept']:.0%} of their tokens, {window['share_truncated']:.0%} of inputs truncated)"
    )


def summary(value: float | None, baselines: dict | None) -> dict:
    """What metrics.json keeps of them: the scores and whether the model beat the best one."""
    if not baselines or not baselines.get("scores"):
        return {}
    return {
        "baselines": dict(baselines["scores"]),
        **({"baselines_other_metrics": baselines["other_metrics"]} if baselines.get("other_metrics") else {}),
        "best_baseline": best(baselines)[0],
        "beats_best_baseline": beats(value, baselines),
    }
