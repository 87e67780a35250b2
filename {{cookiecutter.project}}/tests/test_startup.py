"""What a run costs before its first step, and where its wall time goes: `steps_per_execution:
auto` measured once per setting and reused (resume, rerun, new run directory), on the model that
is trained; time to first step and the goodput record summed over every start of a run."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import PROJECT, tiny_config
from test_doctor import check
from test_train import train_command as interruptible_run
from {{ cookiecutter.package }}.core import config, distribute, goodput, input_pipeline, topology, trainer
from {{ cookiecutter.package }} import tasks, train
from {{ cookiecutter.package }}.core import steps_per_execution as spe_lib
from {{ cookiecutter.package }}.core.keras import keras
from {{ cookiecutter.package }}.doctor import engine
from {{ cookiecutter.package }}.core.model import build_model, compile_model

AUTO = ("train.steps_per_execution=auto", "train.log_every=8", "train.checkpoint_every=8")


def test_calibration_compiles_once_and_training_reuses_it(data_dir, tmp_path):
    """Every candidate runs through one traced train function, and fit() trains with that same one;
    the weights and optimizer state are those from before the calibration."""
    cfg = tiny_config(data_dir, tmp_path, *AUTO)
    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(str(data_dir), tasks.load(cfg.task), cfg.data)
    with resolved.strategy.scope():
        task = tasks.load(cfg.task)
        model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, spe_lib.limit(cfg.train))
        before = spe_lib.Snapshot(model)
        dataset = input_pipeline.training_dataset(cfg, tasks.load(cfg.task), resolved, manifest, seed=0)
        chosen, measurements = spe_lib.calibrate(
            model, iter(dataset), spe_lib.limit(cfg.train), min_seconds=0.05, negligible=None
        )
        calibration_steps = int(model.optimizer.iterations.numpy())
        before.restore()
    assert [m.steps_per_execution for m in measurements] == [1, 4, 8]
    assert all(len(m.rounds) == spe_lib.ROUNDS for m in measurements)
    assert int(model.steps_per_execution.numpy()) == chosen.steps_per_execution
    assert int(model.optimizer.iterations.numpy()) == 0 < calibration_steps
    for variable, value in zip(before.variables, before.values):
        assert (variable.numpy() == value).all(), variable.name
    model.fit(dataset, epochs=1, steps_per_epoch=8, verbose=0)
    assert model.train_tf_function.experimental_get_tracing_count() == 1
    assert int(model.optimizer.iterations.numpy()) == 8


def train_with_its_task(cfg) -> dict:
    return trainer.train(cfg, tasks.load(cfg.task))


@pytest.mark.slow
def test_a_resume_a_rerun_and_a_new_run_directory_reuse_the_calibration(data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(spe_lib, "NEGLIGIBLE", None)  # every candidate measured, whatever the rates
    first = train_with_its_task(tiny_config(data_dir, tmp_path / "run", *AUTO, "train.total_steps=8"))
    printed = capsys.readouterr().out
    assert "calibrating steps_per_execution" in printed and "time to first step" in printed
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    chosen = written["calibration"]["steps_per_execution"]
    assert [m["steps_per_execution"] for m in written["calibration"]["measurements"]] == [1, 4, 8]
    assert first["goodput"]["phase_seconds"]["calibration"] > 0

    # A resume (the same run, trained further): the run's own record.
    train_with_its_task(tiny_config(data_dir, tmp_path / "run", *AUTO, "train.total_steps=16"))
    printed = capsys.readouterr().out
    assert "resumed from step 8" in printed and "calibrating" not in printed
    assert f"steps_per_execution {chosen}: reusing the calibration in this run's metrics.json" in printed
    # A new run directory with the same setting: the cache.
    rerun = train_with_its_task(tiny_config(data_dir, tmp_path / "other", *AUTO, "train.total_steps=8"))
    printed = capsys.readouterr().out
    assert "calibrating" not in printed and "reusing the calibration in the cache" in printed
    assert "calibration" not in rerun["goodput"]["phase_seconds"]
    assert f"steps_per_execution: {chosen}" in (tmp_path / "other" / "config.yaml").read_text()
    # Another setting measures again; so does auto:fresh.
    train_with_its_task(
        tiny_config(data_dir, tmp_path / "bigger", *AUTO, "train.total_steps=8", "train.global_batch_size=64")
    )
    assert "calibrating" in capsys.readouterr().out
    train_with_its_task(
        tiny_config(
            data_dir, tmp_path / "fresh", *AUTO[1:], "train.steps_per_execution=auto:fresh", "train.total_steps=8"
        )
    )
    assert "calibrating" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the calibration's choice


@pytest.mark.parametrize(
    "rates, expected",
    [
        ({1: 10.0, 4: 10.3, 16: 9.9}, 16),  # 9.9 is within 5% of 10.3: the largest value wins
        ({1: 10.0, 4: 12.0, 16: 10.0}, 4),  # 10 is 17% slower than 12
        ({1: 10.0, 4: 9.4, 16: 9.0}, 1),  # 9.4 is 6% slower than 10
    ],
)
def test_the_choice_is_the_largest_candidate_within_5_percent_of_the_fastest(rates, expected):
    measured = [spe_lib.Measurement(value, rate) for value, rate in rates.items()]
    assert spe_lib.choose(measured).steps_per_execution == expected
    assert spe_lib.choose(measured[::-1]).steps_per_execution == expected


def tiny_keras_model():
    """A one-layer model compiled for Keras' multi-step loop, and an endless input for it."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=2)
    batches = tf.data.Dataset.from_tensors((tf.ones([8, 4]), tf.ones([8, 1]))).repeat()
    return model, iter(batches)


@pytest.mark.parametrize(
    "bound, tried",
    [
        (0.001, [1]),  # 0.01 steps fit at 10 steps/s: candidate 1 only (it is always tried)
        (0.35, [1]),  # 3.5 steps at 10 steps/s: not 4
        (0.4, [1, 4, 16]),  # 4 steps at 10 steps/s, then 16 at 40 steps/s; not 64 at 100 steps/s
        (1.0, [1, 4, 16, 64]),  # 10, then 40, then 100 steps fit; not 256 at 150 steps/s
    ],
)
def test_the_time_bound_admits_the_next_candidate_at_the_latest_measured_rate(bound, tried, monkeypatch):
    """Which candidates are tried under `max_seconds_per_execution=bound`, at known rates: each one
    whose execution fits the bound at the rate measured for the candidate before it."""
    rates = {1: 10.0, 4: 40.0, 16: 100.0, 64: 150.0, 256: 150.0}
    monkeypatch.setattr(spe_lib, "_rate", lambda function, iterator, value, seconds: rates[value])
    model, iterator = tiny_keras_model()
    chosen, measurements = spe_lib.calibrate(model, iterator, 256, max_seconds_per_execution=bound)
    assert [m.steps_per_execution for m in measurements] == tried
    assert chosen.steps_per_execution == tried[-1] == int(model.steps_per_execution.numpy())


@pytest.mark.parametrize(
    "rates, tried, rounds, chosen",
    [
        # 4 runs within 5% of 1: the per-call cost is negligible; one round, the larger ones not tried
        ({1: 10.0, 4: 10.3, 16: 10.4, 64: 10.4, 256: 10.4}, [1, 4], 1, 4),
        ({1: 10.0, 4: 9.7, 16: 9.0, 64: 9.0, 256: 9.0}, [1, 4], 1, 4),  # within 5% either way
        # each 4x fewer calls gains, until 64 gains under 5% over 16
        ({1: 10.0, 4: 30.0, 16: 60.0, 64: 61.0, 256: 61.0}, [1, 4, 16, 64], 1, 64),
        # 4 clearly slower than 1 is no per-call cost: measuring goes on, and stops at 16 (as fast as 4)
        ({1: 10.0, 4: 8.0, 16: 8.0, 64: 8.0, 256: 8.0}, [1, 4, 16], 1, 1),
        # every candidate gains: all of them, every round
        ({1: 10.0, 4: 20.0, 16: 40.0, 64: 80.0, 256: 160.0}, [1, 4, 16, 64, 256], spe_lib.ROUNDS, 256),
    ],
)
def test_the_first_round_ends_at_the_first_candidate_that_gains_nothing(rates, tried, rounds, chosen, monkeypatch):
    """At known rates: the candidates measured, how many rounds each, and the choice."""
    calls = []
    monkeypatch.setattr(
        spe_lib, "_rate", lambda function, iterator, value, seconds: calls.append(value) or rates[value]
    )
    model, iterator = tiny_keras_model()
    picked, measurements = spe_lib.calibrate(model, iterator, 256)
    assert [m.steps_per_execution for m in measurements] == tried
    assert [len(m.rounds) for m in measurements] == [rounds] * len(tried) and len(calls) == rounds * len(tried)
    assert picked.steps_per_execution == chosen == int(model.steps_per_execution.numpy())


def test_the_report_says_why_the_measurement_stopped(monkeypatch, capsys, data_dir, tmp_path):
    """The printed reason names the two candidates that ran alike, and the ones not tried."""
    rates = {1: 10.0, 4: 10.2, 8: 10.2}
    monkeypatch.setattr(spe_lib, "_rate", lambda function, iterator, value, seconds: rates[value])
    model, iterator = tiny_keras_model()
    cfg = tiny_config(data_dir, tmp_path, *AUTO)
    chosen, _ = spe_lib.calibrate_and_report(cfg, model, iterator, spe_lib.loop_function(model, iterator))
    printed = capsys.readouterr().out
    assert chosen.steps_per_execution == 4
    assert "stopped after one round: 4 runs within 5.0% of 1 (+2.0%)" in printed and "and 8 cannot" in printed


def test_the_train_function_traces_the_step_once_per_replica_and_trains_as_keras_loop(data_dir, tmp_path, monkeypatch):
    """compile_model's train function traces `train_step` once for each replica (Keras' own loop
    traces it twice), and its executions give Keras' losses, and its weights up to rounding, at
    several steps_per_execution through one trace. With SGD: its update is linear in the gradient,
    so the two loops' float32 rounding stays rounding; AdamW divides a near-zero gradient by its own
    root and turns that rounding into steps the learning rate's size (3e-6 on a text model's bias)."""
    cfg = tiny_config(data_dir, tmp_path, *AUTO, "train.optimizer=sgd")
    task = tasks.load(cfg.task)
    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(str(data_dir), task, cfg.data)
    traced = []

    def run(keras_own: bool) -> tuple[list, list, int]:
        keras.utils.set_random_seed(0)
        with resolved.strategy.scope():
            model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, 4)
            # As the trainer does: a trace that made the optimizer's slots would be traced again.
            model.optimizer.build(model.trainable_variables)
        if keras_own:
            keras.Model.make_train_function(model, force=True)
        original = type(model).train_step
        monkeypatch.setattr(type(model), "train_step", lambda self, data: traced.append(1) or original(self, data))
        iterator = iter(input_pipeline.training_dataset(cfg, task, resolved, manifest, seed=0))
        losses = []
        for value in (4, 1, 2):
            model.steps_per_execution.assign(value)
            losses.append(model.train_function(iterator)["loss"].numpy())
        monkeypatch.setattr(type(model), "train_step", original)
        tracings = model.train_tf_function.experimental_get_tracing_count()
        return losses, [weight.copy() for weight in model.get_weights()], tracings

    ours, our_weights, our_tracings = run(keras_own=False)
    assert len(traced) == resolved.replicas and our_tracings == 1
    traced.clear()
    theirs, their_weights, _ = run(keras_own=True)
    assert len(traced) == 2 * resolved.replicas  # what this saves
    # The first execution starts from the same weights: the same loss, bit for bit. After it, the
    # same updates up to float32 rounding (the graph optimiser inlines the step's function and may
    # order a sum differently; eight replicas' all-reduce need not add in the same order twice):
    # ~3e-7 on weights of order 0.1, and a loss one ulp apart, against a step's change of ~2e-3.
    assert ours[0] == theirs[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0)
    for mine, keras_weight in zip(our_weights, their_weights):
        np.testing.assert_allclose(mine, keras_weight, rtol=1e-5, atol=1e-6)


def test_the_time_bound_stops_where_the_measured_rate_says(capsys):
    """On a real model's measured rates R: each tried candidate fits the bound B at the rate measured
    before it (value <= max(1, B * R)), and the first one not tried would not have fitted at the last
    rate measured. B is set so that about 32 steps fit at this machine's one-step rate."""
    model, iterator = tiny_keras_model()
    train_function = spe_lib.loop_function(model, iterator)
    started, executions = time.perf_counter(), 0
    while executions < 20 or time.perf_counter() - started < 0.05:
        train_function(iterator)["loss"].numpy()
        executions += 1
    bound = 32 / (executions / (time.perf_counter() - started))
    limit = 4**8  # far above what fits: the bound, not the limit, ends the candidates
    _, measurements = spe_lib.calibrate(
        model,
        iterator,
        limit,
        min_seconds=0.05,
        max_seconds_per_execution=bound,
        rounds=1,
        train_function=train_function,
        negligible=None,  # the bound alone: a rate that stops improving would end the candidates too
    )
    tried = [m.steps_per_execution for m in measurements]
    assert tried == spe_lib.candidates(limit)[: len(tried)]
    fits = {m.steps_per_execution: max(1.0, bound * m.rounds[0]) for m in measurements}
    for before, value in zip(tried, tried[1:]):
        assert value <= fits[before], (before, value, fits)
    not_tried = spe_lib.candidates(limit)[len(tried)]
    assert not_tried > fits[tried[-1]], (not_tried, fits)


# ----------------------------------------------------------------------------- the calibration's cache


def another(value):
    """A value of the same kind that differs from `value`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, list):
        return [*value, another(value[-1]) if value else 1]
    if value is None:
        return 1
    raise TypeError(f"no other value for {value!r}")


def edited(cfg, section: str, name: str, value):
    """`cfg` with one key changed (a config is a value: derived, not edited)."""
    if not section:
        return dataclasses.replace(cfg, **{name: value})
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})


def ways_to_change(key: str, cfg, target, precision: str) -> list:
    """(what changes, config, target, precision, TensorFlow version): each way the input behind the
    setting's `key` changes. A key with none fails: a new field of the setting gets its way here."""
    version = tf.__version__
    if key in ("model", "data"):
        section = getattr(cfg, key)
        names = [f.name for f in dataclasses.fields(section) if f.name not in ("dir", "raw")]
        return [
            (f"{key}.{name}", edited(cfg, key, name, another(getattr(section, name))), target, precision, version)
            for name in names
        ]
    if key == "task":
        return [("task", edited(cfg, "", "task", another(cfg.task)), target, precision, version)]
    if key == "limit":  # the smallest of the log, checkpoint, evaluation and run intervals
        log_every = spe_lib.limit(cfg.train) - 1
        return [("train.log_every", edited(cfg, "train", "log_every", log_every), target, precision, version)]
    if key in {f.name for f in dataclasses.fields(cfg.train)}:
        changed = edited(cfg, "train", key, another(getattr(cfg.train, key)))
        return [(f"train.{key}", changed, target, precision, version)]
    attribute = {"strategy": "kind"}.get(key, key)
    if attribute in {f.name for f in dataclasses.fields(target)}:
        changed_target = dataclasses.replace(target, **{attribute: another(getattr(target, attribute))})
        return [(f"target.{attribute}", cfg, changed_target, precision, version)]
    if key == "precision":
        return [("precision", cfg, target, "bfloat16" if precision == "float32" else "float32", version)]
    if key == "tensorflow":
        return [("tensorflow", cfg, target, precision, another(version))]
    pytest.fail(f"the calibration setting has a new field {key!r}: say in ways_to_change how it changes")


def a_setting(*overrides: str):
    cfg = config.load(None, ["train.steps_per_execution=auto", *overrides], registry=tasks)
    return cfg, topology.Target("cpu", 8, 1), "float32"


def test_each_field_of_the_calibration_setting_has_its_own_cache_file(monkeypatch):
    """A change to any input of the choice stores it in another file (the digest of the setting);
    the run directory, the data's location and the seed do not."""
    cfg, target, precision = a_setting()
    base = spe_lib.setting(cfg, target, precision)
    assert {
        "task",
        "model",
        "data",
        "global_batch_size",
        "gradient_accumulation_steps",
        "optimizer",
        "limit",
        "max_seconds_per_execution",
        "strategy",
        "replicas",
        "hosts",
        "tpu_type",
        "precision",
        "tensorflow",
    } <= set(base)
    paths = {"as configured": spe_lib.cache_path("/cache", base)}
    for key in base:
        ways = ways_to_change(key, cfg, target, precision)
        assert ways, key
        for what, changed_cfg, changed_target, changed_precision, version in ways:
            with monkeypatch.context() as patch:
                patch.setattr(tf, "__version__", version)
                changed = spe_lib.setting(changed_cfg, changed_target, changed_precision)
            assert [name for name in base if changed[name] != base[name]] == [key], what
            paths[what] = spe_lib.cache_path("/cache", changed)
    assert len(set(paths.values())) == len(paths), paths
    assert all(path.startswith("/cache/steps_per_execution/") for path in paths.values())
    unchanged = [
        edited(cfg, "data", "dir", "gs://elsewhere/tfrecords"),
        edited(cfg, "data", "raw", "gs://elsewhere/raw"),
        edited(cfg, "runtime", "output_dir", "runs/other"),
        edited(cfg, "runtime", "seed", cfg.runtime.seed + 1),
        edited(cfg, "runtime", "cache_dir", "/elsewhere"),
        edited(cfg, "train", "steps_per_execution", spe_lib.FRESH),
    ]
    for other in unchanged:
        assert spe_lib.cache_path("/cache", spe_lib.setting(other, target, precision)) == paths["as configured"]


def test_a_cache_file_that_cannot_serve_is_measured_again_and_said_once(tmp_path, capsys):
    cfg, target, _ = a_setting(f"runtime.cache_dir={tmp_path}")
    key = spe_lib.setting(cfg, target, cfg.runtime.mixed_precision)
    path = spe_lib.cache_path(str(tmp_path), key)
    measured = [spe_lib.Measurement(1, 10.0, [10.0]), spe_lib.Measurement(4, 30.0, [30.0])]

    def decided():
        decision = spe_lib.decide(cfg, target, None, finished=False)
        return decision, capsys.readouterr().out.splitlines()

    decision, printed = decided()  # no file yet: measured, nothing to say
    assert decision.measure and decision.stored is None and printed == []
    spe_lib.write_cache(path, spe_lib.record(key, measured[1], measured))
    decision, printed = decided()
    assert not decision.measure and decision.compiled == 4 and path in decision.found_in and printed == []
    ignored = {
        "{not json": "not valid JSON",
        b"\xff\xfe\x00": "not valid JSON",
        "[4]": "not a calibration record",
        json.dumps(
            {**spe_lib.record(key, measured[1], measured), "steps_per_execution": "4"}
        ): "not a calibration record",
        json.dumps(
            spe_lib.record({**key, "global_batch_size": key["global_batch_size"] * 2}, measured[1], measured)
        ): "it holds another setting's calibration",
    }
    for content, why in ignored.items():
        (Path(path).write_bytes if isinstance(content, bytes) else Path(path).write_text)(content)
        decision, printed = decided()
        assert decision.measure and decision.stored is None, content
        assert printed == [f"note: ignoring the steps_per_execution cache {path}: {why}; measuring again"], content


def test_a_start_takes_its_own_record_then_the_cache_unless_fresh_finished_or_fixed(tmp_path, capsys):
    """decide()'s order, what every start of train() asks: the run's own metrics.json (a resume),
    then the cache (a rerun, a new run directory), else a measurement; auto:fresh always measures;
    a finished run compiles 1 and measures nothing; a fixed value is taken as it is."""
    cfg, target, _ = a_setting(f"runtime.cache_dir={tmp_path}")
    key = spe_lib.setting(cfg, target, cfg.runtime.mixed_precision)
    measured = [
        spe_lib.Measurement(1, 10.0, [10.0]),
        spe_lib.Measurement(4, 30.0, [30.0]),
        spe_lib.Measurement(16, 31.0, [31.0]),
    ]
    own = spe_lib.record(key, measured[2], measured)  # the run's own calibration: chose 16
    spe_lib.write_cache(spe_lib.cache_path(str(tmp_path), key), spe_lib.record(key, measured[1], measured))  # chose 4

    resumed = spe_lib.decide(cfg, target, own, finished=False)
    assert (resumed.compiled, resumed.found_in, resumed.measure) == (16, "this run's metrics.json", False)
    another_setting = spe_lib.record({**key, "replicas": 4}, measured[2], measured)
    for calibration in (None, another_setting):  # a new run directory; a run record of another setting
        rerun = spe_lib.decide(cfg, target, calibration, finished=False)
        assert (rerun.compiled, rerun.measure) == (4, False) and rerun.found_in.startswith("the cache ")
    fresh_cfg = edited(cfg, "train", "steps_per_execution", spe_lib.FRESH)
    fresh = spe_lib.decide(fresh_cfg, target, own, finished=False)
    assert fresh.measure and fresh.stored is None and fresh.compiled == max(2, spe_lib.limit(cfg.train))
    finished = spe_lib.decide(cfg, target, own, finished=True)
    assert (finished.compiled, finished.key, finished.measure) == (1, None, False)
    fixed = spe_lib.decide(edited(cfg, "train", "steps_per_execution", 8), target, own, finished=False)
    assert (fixed.compiled, fixed.key, fixed.measure) == (8, None, False)
    assert capsys.readouterr().out == ""


def test_the_calibration_cache_on_cloud_storage(gcs_bucket, capsys):
    """runtime.cache_dir on gs:// (a Pod's workers share it): written, found by the next start, and a
    broken object there is said once and measured again."""
    directory = gcs_bucket.path("cache")
    cfg, target, _ = a_setting(f"runtime.cache_dir={directory}")
    key = spe_lib.setting(cfg, target, cfg.runtime.mixed_precision)
    path = spe_lib.cache_path(directory, key)
    assert path.startswith(f"{directory}/steps_per_execution/")
    assert spe_lib.decide(cfg, target, None, finished=False).measure
    measured = [spe_lib.Measurement(1, 10.0, [10.0]), spe_lib.Measurement(4, 30.0, [30.0])]
    spe_lib.write_cache(path, spe_lib.record(key, measured[1], measured))
    found = spe_lib.decide(cfg, target, None, finished=False)
    assert (found.compiled, found.measure, found.found_in) == (4, False, f"the cache {path}")
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write("{not json")
    again = spe_lib.decide(cfg, target, None, finished=False)
    assert again.measure and capsys.readouterr().out.splitlines() == [
        f"note: ignoring the steps_per_execution cache {path}: not valid JSON; measuring again"
    ]
    assert gcs_bucket.blocked_requests() == []


# ----------------------------------------------------------------------------- goodput


def test_the_goodput_record_counts_work_lost_to_a_kill():
    """Three starts: the first killed at step 12 after a checkpoint at 8 (4 steps repeated), the
    second preempted at 20 with a checkpoint there, the third finishing at 30."""
    starts = [
        {
            "initial_step": 0,
            "furthest_step": 12,
            "end": "running",
            "phase_seconds": {"strategy": 1.0, "calibration": 3.0, "first execution": 2.0, "training": 12.0},
        },
        {
            "initial_step": 8,
            "furthest_step": 20,
            "end": "preempted",
            "phase_seconds": {"strategy": 1.0, "first execution": 2.0, "training": 12.0},
        },
        {
            "initial_step": 20,
            "furthest_step": 30,
            "end": "finished",
            "phase_seconds": {"strategy": 1.0, "first execution": 2.0, "training": 10.0, "export": 4.0},
        },
    ]
    record = goodput.summarize(starts)
    assert record["starts"] == 3 and record["repeated_steps"] == 4
    assert record["phase_seconds"] == {
        "strategy": 3.0,
        "calibration": 3.0,
        "first execution": 6.0,
        "training": 34.0,
        "export": 4.0,
    }
    assert record["wall_seconds"] == 50.0
    assert record["productive_seconds"] == pytest.approx(12.0 * 8 / 12 + 12.0 + 10.0)
    assert record["time_to_first_step_seconds"] == [6.0, 3.0, 3.0]
    assert goodput.largest_loss(record) == ("first execution", pytest.approx(6.0 / 50))


def test_doctor_points_at_the_largest_loss_of_the_last_run(data_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  steps_per_execution: 16\n  global_batch_size: 128\n")
    start = {"initial_step": 0, "furthest_step": 400, "end": "finished"}
    slow_calibration = {"strategy": 2.0, "calibration": 30.0, "first execution": 8.0, "training": 60.0}
    record = goodput.summarize([{**start, "phase_seconds": slow_calibration}])
    (run / "metrics.json").write_text(json.dumps({"goodput": record}))
    rule = check(data_dir, output_dir=str(run))["train.goodput"]
    assert rule.status == engine.WARN and "calibration is 30% of the last run's 100 s over 1 start" in rule.message
    assert "train.steps_per_execution=16" in rule.fix
    quick = {"strategy": 2.0, "calibration": 3.0, "first execution": 8.0, "training": 87.0}
    (run / "metrics.json").write_text(json.dumps({"goodput": goodput.summarize([{**start, "phase_seconds": quick}])}))
    rule = check(data_dir, output_dir=str(run))["train.goodput"]
    assert rule.status == engine.PASS and "goodput: 87% of 100 s" in rule.message
    assert check(data_dir, output_dir=str(tmp_path / "no-run"))["train.goodput"].status == engine.SKIP


def train_command(data_dir, output_dir, *overrides):
    """test_train.py's interruptible run, with steps_per_execution measured and a log every 4 steps."""
    return interruptible_run(data_dir, output_dir, "train.steps_per_execution=auto", "train.log_every=4", *overrides)


@dataclasses.dataclass
class Start:
    """One start of a training command as a process: its exit status, each line it printed with when
    the test read it (time.perf_counter()), and its wall seconds from launch to exit."""

    status: int
    lines: list
    wall_seconds: float
    launched: float
    """When the test launched the process (time.perf_counter())."""

    @property
    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def read_at(self, prefix) -> float:
        """When the test read the first line starting with `prefix` (a string or a tuple of them)."""
        return next(at for at, line in self.lines if line.startswith(prefix))


def run_start(command, env, stop=None) -> Start:
    """Runs one start of `command` to its exit; `stop(line, process)`, called with each line until it
    returns True, may signal the process."""
    launched = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, stopped = [], stop is None
    for line in process.stdout:
        lines.append((time.perf_counter(), line))
        stopped = stopped or stop(line, process)
    status = process.wait(timeout=300)
    return Start(status, lines, time.perf_counter() - launched, launched)


def sigterm_at_the_first_step(line: str, process) -> bool:
    if line.startswith("step "):
        process.send_signal(signal.SIGTERM)
        return True
    return False


def logged_step(line: str) -> int | None:
    """N of a `step N/total ...` log line."""
    return int(line.split()[1].split("/")[0]) if line.startswith("step ") else None


def step_in(text: str, prefix: str) -> int:
    """The step number right after `prefix` on the line that starts with it."""
    line = next(line for line in text.splitlines() if line.startswith(prefix))
    return int(line.removeprefix(prefix).split()[0].rstrip(":,"))


def timings(text: str) -> dict:
    line = text.split("timings: ")[1].splitlines()[0]
    return {part.rsplit(" ", 2)[0]: float(part.rsplit(" ", 2)[1]) for part in line.split(", ")}


def assert_sums_of_the_starts(record: dict) -> None:
    """The record's phase seconds are those of its per-start entries, added up."""
    per_start = record["per_start"]
    assert set(record["phase_seconds"]) == set().union(*(start["phase_seconds"] for start in per_start))
    for name, total in record["phase_seconds"].items():
        assert total == pytest.approx(sum(start["phase_seconds"].get(name, 0.0) for start in per_start), abs=0.02)
    assert record["wall_seconds"] == pytest.approx(sum(record["phase_seconds"].values()), abs=0.05)


def assert_the_test_clock_agrees(entry: dict, start: Start, recorded_before: str) -> None:
    """A start's recorded phase seconds against the test's own clock: no more than the process's wall
    time, and no less than the time from the process's launch (the record counts importing TensorFlow
    as start-up) to the test reading the line `recorded_before` that it prints once the record is
    written, less 1.5 s for the interpreter's own start and the test reading that line late."""
    recorded = sum(entry["phase_seconds"].values())
    window = start.read_at(recorded_before) - start.launched
    assert window - 1.5 <= recorded <= start.wall_seconds, (window, recorded, start.wall_seconds)


@pytest.mark.slow
def test_a_run_preempted_twice_sums_its_three_starts(data_dir, tmp_path):
    command = train_command(data_dir, tmp_path, "train.total_steps=400")
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYTHONUNBUFFERED": "1"}
    starts = [run_start(command, env, sigterm_at_the_first_step) for _ in range(2)]
    starts.append(run_start(command, env))
    logs = [start.text for start in starts]
    assert [start.status for start in starts] == [train.PREEMPTED_EXIT_STATUS] * 2 + [0], logs
    assert "calibrating" in logs[0] and "calibrating" not in logs[1] + logs[2]

    stopped = [int(text.split("preempted (SIGTERM) at step ")[1].split(":")[0]) for text in logs[:2]]
    resumed = [step_in(text, "resumed from step") for text in logs[1:]]
    record = json.loads((tmp_path / "metrics.json").read_text())["goodput"]
    per_start = record["per_start"]
    assert record["starts"] == 3 and [start["end"] for start in per_start] == ["preempted", "preempted", "finished"]
    # Each start records the step it stopped at; SIGTERM checkpoints there, so the next start resumes
    # from it and no step is trained twice.
    assert [start["furthest_step"] for start in per_start] == [*stopped, 400]
    assert [start["initial_step"] for start in per_start] == [0, *resumed] == [0, *stopped]
    assert record["repeated_steps"] == 0 and "steps repeated" not in logs[2]
    assert_sums_of_the_starts(record)
    assert "calibration" in per_start[0]["phase_seconds"]
    assert not any("calibration" in start["phase_seconds"] for start in per_start[1:])
    for entry, start in zip(per_start, starts):
        # Each entry is its own start's: what that start printed as its "timings: " line...
        printed = timings(start.text)
        assert set(entry["phase_seconds"]) == set(printed)
        assert entry["phase_seconds"] == pytest.approx(printed, abs=0.2)
        # ... and as long as the test saw it run.
        assert_the_test_clock_agrees(entry, start, "timings: ")
    assert "goodput: " in logs[2] and "over 3 starts" in logs[2]
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("-400")


@pytest.mark.slow
def test_a_start_killed_without_notice_still_counts(data_dir, tmp_path):
    """SIGKILL leaves no checkpoint and no last word: the killed start's entry (written at each log
    line) still counts, and the steps it trained after its last checkpoint are repeated by the next."""
    checkpoint_every, log_every = 32, 4
    command = interruptible_run(
        data_dir,
        tmp_path,
        "train.steps_per_execution=4",
        f"train.log_every={log_every}",
        f"train.checkpoint_every={checkpoint_every}",
        "train.total_steps=96",
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYTHONUNBUFFERED": "1"}
    killed_after = []

    def sigkill_past_a_checkpoint(line: str, process) -> bool:
        # A start records its progress just after each log line: once the second line after a
        # checkpoint is out, the step of the first is recorded. The next checkpoint is 6 executions on.
        step = logged_step(line)
        if step and step > checkpoint_every and step % checkpoint_every == 2 * log_every:
            process.kill()
            killed_after.append(step)
            return True
        return False

    killed = run_start(command, env, sigkill_past_a_checkpoint)
    assert killed.status == -signal.SIGKILL, killed.text
    finished = run_start(command, env)
    assert finished.status == 0, finished.text
    resumed = step_in(finished.text, "resumed from step")

    record = json.loads((tmp_path / "metrics.json").read_text())["goodput"]
    first, second = record["per_start"]
    assert record["starts"] == 2 and (first["end"], second["end"]) == ("running", "finished")
    assert first["initial_step"] == 0 and first["furthest_step"] >= killed_after[0] - log_every
    assert resumed >= checkpoint_every and resumed % checkpoint_every == 0  # a checkpoint's step
    assert second["initial_step"] == resumed and second["furthest_step"] == 96
    assert record["repeated_steps"] == first["furthest_step"] - resumed > 0
    assert f"{record['repeated_steps']} steps repeated after restarts" in finished.text
    # The killed start's time counts: in the sums, as long as the test saw it run up to its last
    # record, and its training time on the repeated steps is not productive.
    assert_sums_of_the_starts(record)
    assert_the_test_clock_agrees(first, killed, f"step {first['furthest_step']:6d}/")
    assert_the_test_clock_agrees(second, finished, "timings: ")
    assert first["phase_seconds"]["training"] > 0
    assert record["productive_seconds"] < record["phase_seconds"]["training"]


@pytest.mark.slow  # three training processes
def test_bench_startup_times_a_fresh_run_a_resume_and_a_rerun(data_dir):
    """The fresh run trains to its end and calibrates; the rerun reuses the cache and is preempted
    after its first step; the resume restores it and trains to the end: each figure is its start's
    from the run's record, and each share is its time to first step over its wall time."""
    from test_bench import TINY, run_module

    # auto: the fresh run calibrates (the shipped local run has a fixed value); 400 steps: long enough
    # that the SIGTERM lands before the run's end.
    steps = ("train.steps_per_execution=auto", "train.total_steps=400")
    output, figures = run_module(
        "bench_startup", "--config", "configs/local.yaml", f"data.dir={data_dir}", *TINY, *steps
    )
    assert {"fresh_seconds", "resume_seconds", "rerun_seconds", "resume_over_fresh", "rerun_over_fresh"} <= set(figures)
    assert all(figures[key] > 0 for key in figures)
    assert figures["resume_over_fresh"] == pytest.approx(figures["resume_seconds"] / figures["fresh_seconds"], abs=0.01)
    for name in ("fresh", "resume"):
        share = figures[f"{name}_seconds"] / figures[f"{name}_wall_seconds"]
        assert figures[f"{name}_share"] == pytest.approx(share, abs=0.002) and 0 < share < 1
    fresh, rerun, resume = output.split("fresh:")[1].split("rerun:")[0], *output.split("rerun:")[1].split("resume:")
    assert "calibrating" in fresh and "preempted" not in fresh
    assert "reusing the calibration in the cache" in rerun and "calibrating" not in rerun
    preempted_at = int(re.search(r"preempted \([^)]*\) at step (\d+)", rerun).group(1))
    assert 0 < preempted_at < 400
    assert "reusing the calibration in this run's metrics.json" in resume and "calibrating" not in resume
    assert f"resumed from step {preempted_at}" in resume
