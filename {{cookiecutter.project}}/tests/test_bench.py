"""Smoke runs of the three benchmarks whose figures the README publishes (`make bench`, `bench-spe`,
`bench-preprocess`), on tiny data: each runs as `make` runs it, prints its table and ends with one
line of JSON holding the documented keys. Figures are printed, never asserted: timings belong in
the README, not in tests."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
from conftest import DATA_OVERRIDES, MODEL_OVERRIDES, PROJECT, tiny_config

TINY = (
    *DATA_OVERRIDES,
    *MODEL_OVERRIDES,
    "train.global_batch_size=32",
    "train.log_every=4",
    "train.checkpoint_every=4",
    "train.total_steps=8",
    "train.warmup_steps=1",
)


def run_module(module: str, *args: str) -> tuple[str, dict]:
    """(stdout, the JSON of its last line) of `python -m <package>.<module> ARGS`."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-m", f"{{ cookiecutter.package }}.{module}", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = result.stdout.strip().splitlines()
    return result.stdout, json.loads(lines[-1])


@pytest.mark.slow  # compiles the model on 8 replicas five times: synthetic data x2 precisions, real, trainer, bare
def test_bench_input_compares_against_the_naive_pipeline_and_synthetic_data(data_dir):
    output, figures = run_module(
        "bench_input",
        "--config",
        "configs/local.yaml",
        f"data.dir={data_dir}",
        *TINY,
        "--seconds",
        "0.3",
        "--rounds",
        "1",
    )
    assert "input, optimized" in output and "input, naive" in output and "training, synthetic data" in output
    assert {
        "optimized_examples_per_s",
        "naive_examples_per_s",
        "speedup",
        "train_steps_per_s_synthetic",
        "train_steps_per_s_real",
        "input_bound",
        "precision",
        "bfloat16_over_float32_step_time",
    } <= set(figures)
    assert figures["optimized_examples_per_s"] > 0 and figures["naive_examples_per_s"] > 0
    assert "bfloat16 step time" in output and figures["bfloat16_over_float32_step_time"] > 0
    # The same order from memory; the trainer against a bare fit; this host's peak, stored for runs.
    assert "train order, cached" in output and figures["cached_over_files_records_per_s"] > 0
    assert "trainer/bare:" in output and figures["trainer_over_bare"] > 0
    # What the trainer adds inside its timed window, item by item, and what it does before it.
    assert "what the trainer adds inside its timed window" in output and "at the first boundary" in output
    assert {"StepLog", "Checkpoints", "fit's end"} <= set(figures["trainer_additions_seconds"])
    assert figures["trainer_window_seconds"] > 0 and figures["bare_seconds_same_steps"] > 0
    assert figures["trainer_first_boundary_seconds"]["StepLog"] > 0
    assert figures["host_peak_tflops"]["float32"] > 0 and figures["host_peak_tflops"]["bfloat16"] > 0
    assert 0 < figures["trainer_model_flops_utilization"] < 1 and figures["trainer_tflops_per_chip"] > 0
    # A save's blocking seconds with and without the background write, on local disk (no --gcs here).
    assert "checkpoint, local disk:" in output and list(figures["checkpoint_blocking"]) == ["local disk"]
    assert figures["checkpoint_blocking"]["local disk"]["synchronous_over_asynchronous"] > 0


def test_bench_parts_and_the_bare_fits_window(float32_policy):
    """--only names parts of `make bench` (a wrong one: one line naming the right ones); the bare fit
    is timed over the trainer's window, from the second execution's start to fit's end."""
    import numpy as np
    import tensorflow as tf

    from {{ cookiecutter.package }} import bench_input
    from {{ cookiecutter.package }}.core.errors import UserError
    from {{ cookiecutter.package }}.core.keras import keras

    assert bench_input.parts_of("") == bench_input.PARTS
    assert bench_input.parts_of("trainer, peak") == ("trainer", "peak")
    named = r"--only takes a comma-separated list of input, peak, trainer, checkpoints; got train$"
    with pytest.raises(UserError, match=named):
        bench_input.parts_of("trainer,train")

    class Boundaries(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.began, self.ended = [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.began.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            self.ended.append(time.perf_counter())

    model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    features = np.zeros((4, 3), "float32")
    dataset = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(4).repeat()
    timer, seen = bench_input._Timer(), Boundaries()
    model.fit(dataset, epochs=1, steps_per_epoch=9, callbacks=[timer, seen], verbose=0)
    steps, seconds = timer.window()
    assert steps == 6 and seconds > 0  # the second and third executions of 3 steps
    assert seen.ended[0] < timer.started <= seen.began[1] and seen.ended[-1] < timer.ended


def test_bench_times_checkpoint_saves_on_local_disk_and_a_gcs_folder(data_dir, gcs_bucket, tmp_path, capsys):
    """`make bench`'s checkpoint part with --gcs (here the tests' storage emulator): a save's
    blocking seconds with and without the background write on each storage; the gs:// folder it
    wrote is removed."""
    import argparse

    import tensorflow as tf

    from {{ cookiecutter.package }} import bench_input, tasks
    from {{ cookiecutter.package }}.core import distribute, input_pipeline

    cfg = tiny_config(data_dir, tmp_path)
    task = tasks.load(cfg.task)
    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(cfg.data.dir, task, cfg.data)
    options = argparse.Namespace(saves=3, seconds=0.4, gcs=gcs_bucket.path("bench"))
    figures = bench_input.checkpoint_comparison(cfg, task, resolved, manifest, options)["checkpoint_blocking"]
    assert list(figures) == ["local disk", "gs://"]
    for storage in figures.values():
        assert storage["synchronous_seconds"] > 0 and storage["asynchronous_seconds"] > 0
        assert storage["synchronous_over_asynchronous"] > 0 and len(storage["asynchronous_first_two_seconds"]) == 2
    printed = capsys.readouterr().out
    assert "checkpoint, local disk:" in printed and "checkpoint, gs://:" in printed
    assert not tf.io.gfile.exists(gcs_bucket.path("bench")) or not tf.io.gfile.listdir(gcs_bucket.path("bench"))
    assert gcs_bucket.blocked_requests() == []


@pytest.mark.slow  # compiles the model once per candidate
def test_bench_spe_measures_every_candidate(data_dir):
    output, figures = run_module("bench_spe", "--config", "configs/local.yaml", f"data.dir={data_dir}", *TINY)
    assert "calibrating steps_per_execution" in output
    assert {"chosen", "chosen_steps_per_s", "best_steps_per_s", "spe1_steps_per_s", "candidates"} <= set(figures)
    assert sorted(figures["candidates"], key=int) == ["1", "4"]  # candidates up to train.log_every
    assert str(figures["chosen"]) in figures["candidates"]


def expected_records(raw, data_dir, min_files: int) -> int:
    """What the benchmark writes: the examples preprocessing accepts from the sample (its manifest),
    once per copy of the sample's files that reaching `min_files` takes."""
    from {{ cookiecutter.package }} import tasks

    splits = json.loads((data_dir / "manifest.json").read_text())["splits"]
    accepted = sum(split["num_examples"] for split in splits.values())
    return accepted * max(1, math.ceil(min_files / len(tasks.load(tasks.DEFAULT).list_raw(str(raw)).units)))


def bench_preprocess(raw, *args: str) -> tuple[str, dict]:
    """`make bench-preprocess` on `raw`, in the shards of the `data_dir` fixture (4 per split)."""
    return run_module(
        "bench_preprocess",
        "--input",
        str(raw),
        "--config",
        "configs/local.yaml",
        *DATA_OVERRIDES,
        "--num_shards",
        "4",
        "--repeats",
        "1",
        *args,
    )


def test_bench_preprocess_compares_beam_with_a_plain_loop(raw_dir, data_dir):
    output, figures = bench_preprocess(raw_dir, "--sizes", "sample", "--min_files", "60", "--no_multi")
    assert "beam in-process" in output and "identical shards" in output and "make preprocess picks" in output
    assert {"beam_records_per_s", "plain_records_per_s", "ratio", "records", "in_process_ratio", "picks"} <= set(
        figures
    )
    assert figures["records"] == expected_records(raw_dir, data_dir, 60)
    assert [size["size"] for size in figures["sizes"]] == ["sample"] and figures["runner"] == "in-process"


def test_bench_preprocess_measures_both_runners_on_larger_copies_of_the_input(raw_dir, data_dir):
    """A size in records is made of whole copies of the input's files, as many as it takes; at each
    size the worker processes write the plain loop's bytes, and the runner `make preprocess`
    picks for that input is reported beside the faster one."""
    from {{ cookiecutter.package }}.core import preprocessing

    sample = expected_records(raw_dir, data_dir, 0)
    output, figures = bench_preprocess(raw_dir, "--sizes", f"sample,{sample + 1}", "--workers", "2")
    first, second = figures["sizes"]
    assert "writing 2 copies of each file" in output and "crossover: " in output
    assert (second["files"], second["bytes"]) == (2 * first["files"], 2 * first["bytes"])
    assert first["records"] == sample and second["records"] >= 2 * sample - 8  # a packed shard's last window
    assert first["multi_identical_shards"] and second["multi_identical_shards"] and figures["multi_identical_shards"]
    assert figures["records"] == second["records"] and figures["workers"] == 2
    for size in (first, second):
        assert size["faster"] in ("in-process", "multi-process") and size["picks"] == "in-process"  # below any size
    assert figures["threshold_bytes"] is None or figures["threshold_bytes"] > second["bytes"]
    assert isinstance(figures["ratio"], float) and figures["runner"] == second["faster"]
    assert preprocessing.megabytes(second["bytes"]) in output


def test_bench_preprocess_reads_sizes_and_finds_the_crossover():
    """--sizes: the sample first, record counts and sizes in bytes; the crossover interpolated
    between the sizes around the change of the faster runner."""
    from {{ cookiecutter.package }}.bench_preprocess import crossover, parse_sizes
    from {{ cookiecutter.package }}.core.errors import UserError

    assert parse_sizes("100k,sample, 2500,1.5GB,500mb") == [
        ("sample", 0),
        ("records", 100_000),
        ("records", 2500),
        ("bytes", 1_500_000_000),
        ("bytes", 500_000_000),
    ]
    with pytest.raises(UserError, match="'1m' is not a size; give `sample`, a record count"):
        parse_sizes("sample,1m")
    sizes = [
        {"bytes": 3_000_000, "in_process_s": 4.0, "multi_s": 3.0},
        {"bytes": 1_000_000, "in_process_s": 1.0, "multi_s": 2.0},
        {"bytes": 500_000, "in_process_s": 0.5, "multi_s": 1.9},
    ]
    at, sentence = crossover(sizes)
    assert at == pytest.approx(2_000_000) and "between 1.0 MB and 3.0 MB" in sentence
    assert crossover(sizes[1:]) == (
        None,
        "the in-process runner was as fast or faster at the largest size measured, 1.0 MB",
    )
    assert crossover(sizes[:1]) == (None, "worker processes were faster at every size measured, from 3.0 MB")
    # Ahead at one size, behind at a larger one: the crossover is where they stay ahead.
    behind = [*sizes, {"bytes": 6_000_000, "in_process_s": 8.0, "multi_s": 9.0}]
    assert crossover(behind)[0] is None
    assert crossover([*behind, {"bytes": 9_000_000, "in_process_s": 12.0, "multi_s": 10.0}])[0] == pytest.approx(
        7_000_000
    )


def test_bench_preprocess_skips_a_broken_first_file_like_preprocessing(raw_dir, data_dir, tmp_path):
    """The warm-up encodes the first raw input in sorted order: when that one is broken, it is
    rejected as preprocessing rejects it, not a traceback."""
    import shutil

    from {{ cookiecutter.package }} import tasks

    raw = tmp_path / "raw"
    shutil.copytree(raw_dir, raw)
    first = tasks.load(tasks.DEFAULT).list_raw(str(raw)).units[0]
    broken = raw / first.rpartition("/")[0] / f"-empty{first[first.rindex('.') :]}"  # sorts first
    broken.write_bytes(b"")
    assert tasks.load(tasks.DEFAULT).list_raw(str(raw)).units[0] == str(broken.relative_to(raw))
    output, figures = bench_preprocess(raw, "--sizes", "sample", "--min_files", "10", "--no_multi")
    assert figures["records"] == expected_records(raw, data_dir, 10)  # the empty file: no record
