"""What a run costs before its first step, and where its wall time goes: `steps_per_execution:
auto` measured once per setting and reused (resume, rerun, new run directory), on the model that
is trained; time to first step and the goodput record summed over every start of a run."""

import json
import os
import signal
import subprocess

import pytest
import tensorflow as tf

from conftest import PROJECT, tiny_config
from test_doctor import check
from test_train import train_command as interruptible_run
from {{ cookiecutter.package }}.core import distribute, goodput, input_pipeline, trainer
from {{ cookiecutter.package }} import train
from {{ cookiecutter.package }}.core import steps_per_execution as spe_lib
from {{ cookiecutter.package }}.doctor import engine
from {{ cookiecutter.package }}.core.model import build_model, compile_model

AUTO = ("train.steps_per_execution=auto", "train.log_every=8", "train.checkpoint_every=8")


def test_calibration_compiles_once_and_training_reuses_it(data_dir, tmp_path):
    """Every candidate runs through one traced train function, and fit() trains with that same one;
    the weights and optimizer state are those from before the calibration."""
    cfg = tiny_config(data_dir, tmp_path, *AUTO)
    resolved = distribute.resolve(cfg.runtime)
    manifest = input_pipeline.read_manifest(str(data_dir), cfg.data)
    with resolved.strategy.scope():
        model = compile_model(build_model(cfg, manifest), cfg.train, spe_lib.limit(cfg.train))
        before = spe_lib.Snapshot(model)
        dataset = trainer.training_dataset(cfg, resolved, manifest, seed=0)
        chosen, measurements = spe_lib.calibrate(model, iter(dataset), spe_lib.limit(cfg.train), min_seconds=0.05)
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


@pytest.mark.slow
def test_a_resume_a_rerun_and_a_new_run_directory_reuse_the_calibration(data_dir, tmp_path, capsys):
    first = trainer.train(tiny_config(data_dir, tmp_path / "run", *AUTO, "train.total_steps=8"))
    printed = capsys.readouterr().out
    assert "calibrating steps_per_execution" in printed and "time to first step" in printed
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    chosen = written["calibration"]["steps_per_execution"]
    assert [m["steps_per_execution"] for m in written["calibration"]["measurements"]] == [1, 4, 8]
    assert first["goodput"]["phase_seconds"]["calibration"] > 0

    # A resume (the same run, trained further): the run's own record.
    trainer.train(tiny_config(data_dir, tmp_path / "run", *AUTO, "train.total_steps=16"))
    printed = capsys.readouterr().out
    assert "resumed from step 8" in printed and "calibrating" not in printed
    assert f"steps_per_execution {chosen}: reusing the calibration in this run's metrics.json" in printed
    # A new run directory with the same setting: the cache.
    rerun = trainer.train(tiny_config(data_dir, tmp_path / "other", *AUTO, "train.total_steps=8"))
    printed = capsys.readouterr().out
    assert "calibrating" not in printed and "reusing the calibration in the cache" in printed
    assert "calibration" not in rerun["goodput"]["phase_seconds"]
    assert f"steps_per_execution: {chosen}" in (tmp_path / "other" / "config.yaml").read_text()
    # Another setting measures again; so does auto:fresh.
    trainer.train(
        tiny_config(data_dir, tmp_path / "bigger", *AUTO, "train.total_steps=8", "train.global_batch_size=64")
    )
    assert "calibrating" in capsys.readouterr().out
    trainer.train(
        tiny_config(
            data_dir, tmp_path / "fresh", *AUTO[1:], "train.steps_per_execution=auto:fresh", "train.total_steps=8"
        )
    )
    assert "calibrating" in capsys.readouterr().out


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


def run_until_a_step_then_sigterm(command, env) -> str:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("step "):
            process.send_signal(signal.SIGTERM)
            break
    output += process.stdout.readlines()
    assert process.wait(timeout=300) == train.PREEMPTED_EXIT_STATUS, "".join(output)
    return "".join(output)


def timings(text: str) -> dict:
    line = text.split("timings: ")[1].splitlines()[0]
    return {part.rsplit(" ", 2)[0]: float(part.rsplit(" ", 2)[1]) for part in line.split(", ")}


@pytest.mark.slow
def test_a_run_preempted_twice_sums_its_three_starts(data_dir, tmp_path):
    command = train_command(data_dir, tmp_path, "train.total_steps=400")
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "PYTHONUNBUFFERED": "1"}
    logs = [run_until_a_step_then_sigterm(command, env), run_until_a_step_then_sigterm(command, env)]
    finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    logs.append(finished.stdout)
    assert "calibrating" in logs[0] and "calibrating" not in logs[1] + logs[2]

    def step_in(text: str, prefix: str) -> int:
        return int(next(line for line in text.splitlines() if line.startswith(prefix)).split()[-1].rstrip(":"))

    stopped = [int(text.split("preempted (SIGTERM) at step ")[1].split(":")[0]) for text in logs[:2]]
    resumed = [step_in(text, "resumed from step") for text in logs[1:]]
    record = json.loads((tmp_path / "metrics.json").read_text())["goodput"]
    assert record["starts"] == 3 and [start["end"] for start in record["per_start"]] == [
        "preempted",
        "preempted",
        "finished",
    ]
    assert record["repeated_steps"] == sum(max(0, stop - resume) for stop, resume in zip(stopped, resumed))
    assert [start["initial_step"] for start in record["per_start"]] == [0, *resumed]
    # Each start's "timings: <phase> <seconds> s, ..." line is what the sums add up (to its rounding).
    printed = [timings(text) for text in logs]
    for name, total in record["phase_seconds"].items():
        assert total == pytest.approx(sum(start.get(name, 0.0) for start in printed), abs=0.2), name
    assert "goodput: " in logs[2] and "over 3 starts" in logs[2]
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("-400")


@pytest.mark.slow  # three training processes
def test_bench_startup_times_a_fresh_run_a_resume_and_a_rerun(data_dir):
    from test_bench import TINY, run_module

    output, figures = run_module("bench_startup", "--config", "configs/local.yaml", f"data.dir={data_dir}", *TINY)
    assert {"fresh_seconds", "resume_seconds", "rerun_seconds", "resume_over_fresh", "rerun_over_fresh"} <= set(figures)
    assert all(figures[key] > 0 for key in figures)
    assert figures["resume_over_fresh"] == pytest.approx(figures["resume_seconds"] / figures["fresh_seconds"], abs=0.01)
    fresh, resume, rerun = output.split("fresh:")[1].split("resume:")[0], *output.split("resume:")[1].split("rerun:")
    assert "calibrating" in fresh
    assert "reusing the calibration in this run's metrics.json" in resume and "calibrating" not in resume
    assert "reusing the calibration in the cache" in rerun and "calibrating" not in rerun
