"""`make doctor`: every rule fires, with its fix, on a config that breaks it, and the shipped
configs have no FAIL. The TPU VM rules run on temporary files standing in for /dev and /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA_OVERRIDES, REPLICAS, task_of_data

from {{ cookiecutter.package }}.core import baselines, config, support, topology
from {{ cookiecutter.package }} import doctor, tasks
from {{ cookiecutter.package }}.doctor import data as data_rules
from {{ cookiecutter.package }}.doctor import engine, tpu_vm
from {{ cookiecutter.package }}.core.errors import UserError, run_cli

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = PROJECT / "configs"
TPU_CONFIGS = [name for name in ("tpu.yaml", "pod.yaml") if (CONFIGS / name).exists()]


def check(
    data_dir,
    *overrides: str,
    config_file: str = "local.yaml",
    tmp_path=None,
    target: str = "auto",
    tpu_type: str | None = None,
    on_tpu_vm: bool = False,
    output_dir: str | None = None,
) -> dict:
    """The doctor's results for a config of the task whose sample `data_dir` holds (the project's
    own, or another task's config folder), by rule name."""
    name = task_of_data(data_dir)
    task = tasks.load(name)
    folder = CONFIGS if name == tasks.DEFAULT else CONFIGS / name
    data_overrides = [item for item in task.testing().overrides if item.startswith("data.")]
    base = [f"data.dir={data_dir}", *data_overrides, f"runtime.cpu_devices={REPLICAS}"]  # the TPU path's 8
    if output_dir or tmp_path:
        base.append(f"runtime.output_dir={output_dir or tmp_path / 'run'}")
    cfg = config.load(str(folder / config_file), [*base, *overrides], registry=tasks)
    if tpu_type and target == "auto":
        target = "tpu"
    found = engine.resolve_target(cfg, target=target, tpu_type=tpu_type, on_tpu_vm=on_tpu_vm)
    results = engine.run_rules(engine.Context(cfg, task, found, on_tpu_vm=on_tpu_vm))
    return {result.rule: result for result in results}


def failures(results: dict) -> list:
    return [result for result in results.values() if result.status == engine.FAIL]


def run_doctor(*args: str) -> subprocess.CompletedProcess:
    """`make doctor` without make: the module in a fresh process, as the Makefile runs it."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package }}.doctor", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# ----------------------------------------------------------------------------- the command


def test_make_doctor_passes_on_the_local_defaults(data_dir, tmp_path):
    result = run_doctor(
        "--config", "configs/local.yaml", f"data.dir={data_dir}", *DATA_OVERRIDES, f"runtime.output_dir={tmp_path}"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "target: CPU, 2 replicas" in result.stdout  # the shipped runtime.cpu_devices
    assert "PASS  batch.divisible" in result.stdout
    assert "0 failed" in result.stdout
    # The support matrix's line for the project's TPU type, whatever the target.
    [support_line] = [line for line in result.stdout.splitlines() if "tpu.support" in line]
    assert f"on {topology.DEFAULT_TPU_TYPE} (" in support_line, support_line
    for rule in ("tpu.devices", "tpu.software", "tpu.lock_file", "tpu.log_dir"):
        assert f"SKIP  {rule}" in result.stdout and engine.NOT_A_TPU_VM in result.stdout


def test_make_doctor_fails_on_a_batch_that_does_not_divide(data_dir, tmp_path):
    """The issue's acceptance case."""
    result = run_doctor(
        "--config",
        "configs/local.yaml",
        f"data.dir={data_dir}",
        *DATA_OVERRIDES,
        f"runtime.output_dir={tmp_path}",
        "train.global_batch_size=100",
        "runtime.cpu_devices=8",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if "batch.divisible" in line)
    assert line.startswith("FAIL")
    assert "does not divide across 8 replicas" in line
    assert "fix: train.global_batch_size=96 or 104" in line
    assert "1 failed" in result.stdout


def test_a_bad_config_key_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(doctor.main, ["--config", str(CONFIGS / "local.yaml"), "train.global_batch_siz=64"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did you mean 'train.global_batch_size'" in err


def test_a_bad_tpu_type_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(doctor.main, ["--config", str(CONFIGS / "local.yaml"), "--target", "tpu", "--tpu_type", "v9-8"])
    assert exit_info.value.code == 2
    assert "unknown TPU type 'v9-8'" in capsys.readouterr().err


def test_report_is_one_line_per_rule_with_the_fix():
    results = [engine.Result(engine.PASS, "a.rule", "fine"), engine.Result(engine.FAIL, "b.longer_rule", "bad", "do x")]
    lines = engine.format_report(results).splitlines()
    assert lines == ["PASS  a.rule         fine", "FAIL  b.longer_rule  bad  -> fix: do x"]
    assert engine.summary(results).startswith("1 passed, 0 warnings, 1 failed, 0 skipped")


# ----------------------------------------------------------------------------- defaults


def test_local_defaults_have_no_failure(data_dir, tmp_path):
    results = check(data_dir, tmp_path=tmp_path)
    assert failures(results) == []
    assert set(results) == {name for name, _, _ in [*engine.RULES, *engine.task_rules(tasks.load(tasks.DEFAULT))]}


@pytest.mark.parametrize("config_file", TPU_CONFIGS)
def test_tpu_configs_have_no_failure(config_file, data_dir, gcs_bucket, tmp_path):
    """The TPU configs against the project's TPU type, and pod.yaml against a multi-host slice
    reading its shards from (emulated) Cloud Storage."""
    import tensorflow as tf

    if config_file == "pod.yaml":
        remote = gcs_bucket.path("doctor", "tfrecords")
        for name in os.listdir(data_dir):
            tf.io.gfile.copy(str(data_dir / name), f"{remote}/{name}", overwrite=True)
        results = check(remote, config_file=config_file, tpu_type="v4-32", output_dir=gcs_bucket.path("doctor", "run"))
        assert results["data.location"].status == engine.PASS
    else:
        results = check(data_dir, config_file=config_file, tmp_path=tmp_path, target="tpu")
    assert failures(results) == [], failures(results)
    assert results["batch.per_core_128"].status != engine.SKIP


# ----------------------------------------------------------------------------- the target


def test_target_follows_the_strategy_and_the_machine():
    cfg = config.load(str(CONFIGS / "local.yaml"), ["runtime.cpu_devices=4"], registry=tasks)
    assert engine.resolve_target(cfg).replicas == 4
    assert engine.resolve_target(cfg).kind == "cpu"
    default = topology.topology(topology.DEFAULT_TPU_TYPE)
    on_vm = engine.resolve_target(cfg, on_tpu_vm=True)
    assert (on_vm.kind, on_vm.replicas, on_vm.hosts) == ("tpu", default.replicas, default.hosts)
    pod = engine.resolve_target(cfg, target="tpu", tpu_type="v4-32")
    assert (pod.kind, pod.replicas, pod.hosts) == ("tpu", 16, 4)
    assert engine.resolve_target(cfg, tpu_type="v4-32").kind == "cpu"  # the type alone does not make a TPU target
    forced = config.load(str(CONFIGS / "local.yaml"), ["runtime.strategy=tpu"], registry=tasks)
    assert engine.resolve_target(forced).kind == "tpu"
    cpu = config.load(str(CONFIGS / "local.yaml"), ["runtime.strategy=cpu"], registry=tasks)
    assert engine.resolve_target(cpu, on_tpu_vm=True).kind == "cpu"
    named = config.load(str(CONFIGS / "local.yaml"), ["runtime.tpu=my-pod"], registry=tasks)
    assert engine.resolve_target(named).kind == "tpu"


# ----------------------------------------------------------------------------- batch


def test_the_hints_name_the_configs_of_the_task_checked(data_dir, tmp_path, monkeypatch):
    """Off a TPU the MXU rules point at the TPU config of the task being checked: configs/tpu.yaml
    for the project's own task, configs/<task>/tpu.yaml for one added with make new-task."""
    results = check(data_dir, tmp_path=tmp_path, target="cpu")
    assert "`make doctor CONFIG=configs/tpu.yaml`" in results["model.feature_dims"].message
    assert config.shipped_config(tasks.DEFAULT, "pod", registry=tasks) == "configs/pod.yaml"
    task = tasks.load(tasks.DEFAULT)
    monkeypatch.setattr(task, "name", "tagging")
    results = check(data_dir, tmp_path=tmp_path, target="cpu")
    for name in ("model.feature_dims", "model.narrow_layers"):
        assert "`make doctor CONFIG=configs/tagging/tpu.yaml`" in results[name].message, results[name]


def test_batch_not_a_multiple_of_8_per_core_warns_on_a_tpu(data_dir, tmp_path):
    results = check(data_dir, "train.global_batch_size=48", tmp_path=tmp_path, tpu_type="v5litepod-8")
    rule = results["batch.multiple_of_8"]
    assert rule.status == engine.WARN and "6 per replica" in rule.message
    assert "train.global_batch_size=64" in rule.fix


def test_batch_under_128_per_core_warns_on_a_tpu(data_dir, tmp_path):
    results = check(data_dir, "train.global_batch_size=512", tmp_path=tmp_path, tpu_type="v5litepod-8")
    rule = results["batch.per_core_128"]
    assert rule.status == engine.WARN and "64 per core" in rule.message
    assert rule.fix.startswith("train.global_batch_size=1024")
    results = check(data_dir, "train.global_batch_size=1024", tmp_path=tmp_path, tpu_type="v5litepod-8")
    assert results["batch.per_core_128"].status == engine.PASS
    assert results["batch.divisible"].message == "global batch 1024 = 128 per replica x 8"


# ----------------------------------------------------------------------------- model


def test_float32_on_a_tpu_warns(data_dir, tmp_path):
    rule = check(data_dir, "runtime.mixed_precision=float32", tmp_path=tmp_path, target="tpu")["model.precision"]
    assert rule.status == engine.WARN and rule.fix == "runtime.mixed_precision=bfloat16"


def test_the_plan_holds_the_configs_own_gradient_accumulator(data_dir, tmp_path):
    """train.gradient_accumulation_steps=2: the plan (the core's, and the doctor's memory rule's) holds
    an accumulator the size of the trainable weights in float32, counted here from the model training
    builds; at 1, none. Everything else in the plan is the same: accumulation does not change the
    micro-batch of a replica."""
    from {{ cookiecutter.package }}.core import input_pipeline, memory
    from {{ cookiecutter.package }}.core.model import build_model
    from {{ cookiecutter.package }}.doctor import memory as memory_rule

    def plans(accumulation: int):
        base = [f"data.dir={data_dir}", *DATA_OVERRIDES, f"runtime.cpu_devices={REPLICAS}"]
        cfg = config.load(
            str(CONFIGS / "local.yaml"), [*base, f"train.gradient_accumulation_steps={accumulation}"], registry=tasks
        )
        task = tasks.load(tasks.DEFAULT)
        ctx = engine.Context(cfg, task, engine.resolve_target(cfg, target="tpu", tpu_type="v4-8"))
        manifest = input_pipeline.read_manifest(str(data_dir), task, cfg.data)
        core = memory.estimate_for(cfg, task, manifest, ctx.per_replica_batch, 2**34)
        rule = check(data_dir, f"train.gradient_accumulation_steps={accumulation}", tmp_path=tmp_path, tpu_type="v4-8")[
            "model.memory"
        ]
        return core, memory_rule.Planner(ctx, 2**34).plan(), rule, cfg, task, manifest

    core, doctor_plan, rule, cfg, task, manifest = plans(2)
    trainable = sum(int(weight.shape.num_elements()) for weight in build_model(cfg, task, manifest).trainable_weights)
    assert core.accumulator == doctor_plan.accumulator == 4 * trainable > 0
    assert "accumulator" in rule.message
    single, single_doctor, single_rule, *_ = plans(1)
    assert single.accumulator == single_doctor.accumulator == 0 and "accumulator" not in single_rule.message
    assert core.total == single.total + 4 * trainable and doctor_plan.total == single_doctor.total + 4 * trainable
    # The config's optimizer (adamw: two moments; sgd: one momentum) unless a lever names another.
    moments = {"adamw": 2, "sgd": 1 if cfg.train.momentum else 0}[cfg.train.optimizer]
    assert moments > 0 and core.optimizer_slots == moments * core.gradients
    factored = memory.Planner(cfg, task, manifest).plan(8, 2**34, precision_name="bfloat16", optimizer="adafactor")
    assert 0 < factored.optimizer_slots < core.gradients


def test_the_flops_rule_gives_the_training_logs_count_and_the_time_at_the_chips_peak(data_dir, tmp_path):
    """model.flops on a TPU target (a v4-8, whatever the project's type: 4 chips of 275 TFLOP/s bfloat16): the FLOPs
    that the training log divides (utilisation.step_flops of the model as training builds it, counted
    from its own trace, not the plan's), and the time they take at the 4 chips' peak; with gradient
    accumulation of 2, twice the examples of an update and twice the FLOPs."""
    import re

    from {{ cookiecutter.package }}.core import input_pipeline, utilisation
    from {{ cookiecutter.package }}.core.model import build_model

    def rule_figures(*overrides: str) -> tuple[float, int, float]:
        rule = check(data_dir, *overrides, tmp_path=tmp_path, target="tpu", tpu_type="v4-8")["model.flops"]
        found = re.fullmatch(
            r"([0-9.,]+) GFLOP per optimizer step \(3 x the forward pass's matrix multiplies of (\d+) examples; not "
            r"counted: .*\): at least ([0-9.,]+) ms a step at 275 TFLOP/s per chip x 4 chips \(v4 bfloat16 peak .*\), "
            r"the time at 100% MFU",
            rule.message,
        )
        assert rule.status == engine.PASS and found, rule
        number = lambda text: float(text.replace(",", ""))  # noqa: E731
        return number(found[1]) * 1e9, int(found[2]), number(found[3]) / 1e3

    def training_count(*overrides: str) -> float:
        base = [f"data.dir={data_dir}", *DATA_OVERRIDES, f"runtime.cpu_devices={REPLICAS}", *overrides]
        cfg = config.load(str(CONFIGS / "local.yaml"), base, registry=tasks)
        task, target = tasks.load(tasks.DEFAULT), engine.resolve_target(cfg, target="tpu", tpu_type="v4-8")
        model = build_model(cfg, task, input_pipeline.read_manifest(str(data_dir), task, cfg.data))
        flops, unknown = utilisation.step_flops(model, cfg, target)
        assert not unknown
        return flops

    flops, examples, seconds = rule_figures()
    expected = training_count()
    assert flops == pytest.approx(expected, rel=2e-3)
    assert seconds == pytest.approx(expected / (4 * 275e12), rel=2e-3)
    accumulated, twice, _ = rule_figures("train.gradient_accumulation_steps=2")
    assert twice == 2 * examples and accumulated == pytest.approx(2 * flops, rel=2e-3)
    assert accumulated == pytest.approx(training_count("train.gradient_accumulation_steps=2"), rel=2e-3)


def test_the_host_cpus_bfloat16_is_reported_with_the_local_config(data_dir, tmp_path, monkeypatch):
    from {{ cookiecutter.package }}.core import precision

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "fma"})  # an AVX2-only CPU
    rule = check(data_dir, tmp_path=tmp_path)["model.precision"]
    assert rule.status == engine.PASS and rule.message.startswith("float32 (auto: this CPU has no native bfloat16")
    forced = check(data_dir, "runtime.mixed_precision=bfloat16", tmp_path=tmp_path)["model.precision"]
    assert forced.status == engine.WARN and "emulated" in forced.message
    assert forced.fix.startswith("runtime.mixed_precision=auto")
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512_bf16", "amx_bf16"})
    rule = check(data_dir, tmp_path=tmp_path)["model.precision"]
    assert rule.status == engine.PASS and rule.message.startswith("bfloat16 (auto: this CPU has native bfloat16")


# ----------------------------------------------------------------------------- input


def test_the_real_input_has_static_shapes(data_dir, tmp_path):
    rule = check(data_dir, tmp_path=tmp_path)["input.static_shapes"]
    assert rule.status == engine.PASS and "train [16, " in rule.message and "] [16]" in rule.message


def test_input_without_drop_remainder_fails(data_dir, tmp_path, monkeypatch):
    from {{ cookiecutter.package }}.core import input_pipeline

    def dynamic(real):
        def unbatched(*args, **kwargs):
            return real(*args, **kwargs).unbatch().batch(kwargs.get("batch_size", args[4]))  # no drop_remainder

        return unbatched

    for name in ("train_pipeline", "eval_pipeline"):
        monkeypatch.setattr(input_pipeline, name, dynamic(getattr(input_pipeline, name)))
    rule = check(data_dir, tmp_path=tmp_path)["input.static_shapes"]
    assert rule.status == engine.FAIL and "drop_remainder=True" in rule.fix


def test_missing_manifest_fails_with_make_preprocess(tmp_path):
    results = check(tmp_path / "nothing", tmp_path=tmp_path)
    rule = results["data.manifest"]
    assert rule.status == engine.FAIL and "make preprocess" in rule.fix
    assert results["input.static_shapes"].status == engine.SKIP
    assert results["data.shard_count"].status == engine.SKIP


def _copy_data(data_dir: Path, destination: Path) -> dict:
    destination.mkdir()
    for name in os.listdir(data_dir):
        (destination / name).write_bytes((data_dir / name).read_bytes())
    return json.loads((destination / "manifest.json").read_text())


def test_unreadable_or_mismatched_manifest_fails(data_dir, tmp_path):
    broken = tmp_path / "broken"
    _copy_data(data_dir, broken)
    (broken / "manifest.json").write_text("{not json")
    rule = check(broken, tmp_path=tmp_path)["data.manifest"]
    assert rule.status == engine.FAIL and "not valid JSON" in rule.message and "make preprocess" in rule.fix

    other = tmp_path / "other_spec"
    manifest = _copy_data(data_dir, other)
    manifest["feature_spec"]["version"] = 0
    (other / "manifest.json").write_text(json.dumps(manifest))
    rule = check(other, tmp_path=tmp_path)["data.manifest"]
    assert rule.status == engine.FAIL and "feature spec" in rule.message and "make preprocess" in rule.fix

    rule = check(data_dir, tmp_path=tmp_path)["data.manifest"]
    assert rule.status == engine.PASS
    # A config the shards do not fit (the task's own example): a FAIL whose fix names the key.
    task = tasks.load(tasks.DEFAULT)
    mismatch = task.testing().mismatch
    wrong = config.load(
        str(CONFIGS / "local.yaml"), [f"data.dir={data_dir}", *DATA_OVERRIDES, mismatch], registry=tasks
    )
    rule = data_rules.data_manifest(engine.Context(wrong, task, engine.resolve_target(wrong)))
    assert rule.status == engine.FAIL
    assert mismatch.split("=")[0] in rule.message + rule.fix


def test_few_small_shards_warn(data_dir, tmp_path):
    results = check(data_dir, tmp_path=tmp_path)  # 4 shards of the sample data, far under 10 MB
    assert results["data.shard_count"].status == engine.WARN
    assert "train 4 / eval 4 shards for 1 reading host" in results["data.shard_count"].message
    assert results["data.shard_size"].status == engine.WARN and "under 10 MB" in results["data.shard_size"].message


def _context_with_shards(files: int, shard_mb: float, tpu_type: str = "v4-32") -> engine.Context:
    cfg = config.load(str(CONFIGS / "local.yaml"), ["data.dir=gs://bucket/data"], registry=tasks)
    context = engine.Context(cfg, tasks.load(cfg.task), engine.resolve_target(cfg, target="tpu", tpu_type=tpu_type))
    split = {"files": [f"train-{i}" for i in range(files)], "bytes": int(files * shard_mb * 2**20)}
    context.__dict__["manifest_or_error"] = ({"splits": {"train": split, "eval": split}}, "", "")
    return context


def test_shard_rules_count_per_reading_host():
    assert data_rules.data_shard_count(_context_with_shards(40, 120)).status == engine.PASS  # 4 hosts x 10
    assert data_rules.data_shard_size(_context_with_shards(40, 120)).status == engine.PASS
    few = data_rules.data_shard_count(_context_with_shards(20, 120))
    assert few.status == engine.WARN and "--num_shards 40" in few.fix
    small = data_rules.data_shard_size(_context_with_shards(400, 5))
    assert small.status == engine.WARN and "--num_shards 40" in small.fix
    assert "100 MB+ is ideal" in data_rules.data_shard_size(_context_with_shards(40, 50)).message


def test_local_data_on_a_multi_host_slice_fails(data_dir, tmp_path):
    results = check(data_dir, "train.global_batch_size=1024", tmp_path=tmp_path, tpu_type="v4-32")
    rule = results["data.location"]
    assert rule.status == engine.FAIL and "4 hosts" in rule.message and "gs://" in rule.fix
    assert results["run.location"].status == engine.WARN
    assert "for 4 reading hosts" in results["data.shard_count"].message
    assert check(data_dir, tmp_path=tmp_path, tpu_type="v4-8")["data.location"].status == engine.PASS
    remote = config.load(str(CONFIGS / "local.yaml"), ["data.dir=gs://bucket/data"], registry=tasks)
    context = engine.Context(
        remote, tasks.load(remote.task), engine.resolve_target(remote, target="tpu", tpu_type="v4-32")
    )
    assert data_rules.data_location(context).status == engine.PASS


# ----------------------------------------------------------------------------- steps_per_execution


def test_steps_per_execution_rules(data_dir, tmp_path):
    assert check(data_dir, tmp_path=tmp_path)["train.steps_per_execution"].status == engine.PASS  # 4, as shipped
    auto = check(data_dir, "train.steps_per_execution=auto", tmp_path=tmp_path)["train.steps_per_execution"]
    assert auto.status == engine.PASS and "measured once per setting" in auto.message
    one = check(data_dir, "train.steps_per_execution=1", tmp_path=tmp_path)["train.steps_per_execution"]
    assert one.status == engine.WARN and "auto" in one.fix

    big = check(data_dir, "train.steps_per_execution=64", tmp_path=tmp_path)["train.execution_boundaries"]
    assert big.status == engine.WARN and "log_every=50" in big.message and "train.steps_per_execution=50" in big.fix
    uneven = check(data_dir, "train.steps_per_execution=8", tmp_path=tmp_path)["train.execution_boundaries"]
    assert uneven.status == engine.PASS and "first execution boundary after every 50 steps" in uneven.message
    even = check(data_dir, "train.steps_per_execution=25", tmp_path=tmp_path)["train.execution_boundaries"]
    assert even.status == engine.PASS and "divides" in even.message


def test_steps_per_execution_against_the_measured_step_time(data_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  global_batch_size: 128\n  steps_per_execution: 4\n")
    (run / "metrics.json").write_text(json.dumps({"examples_per_second": 128 / 0.002}))  # 2 ms per step
    rule = check(data_dir, "train.steps_per_execution=8", tmp_path=tmp_path)["train.steps_per_execution"]
    assert rule.status == engine.WARN and "too small against the measured step time" in rule.message
    assert "2.0 ms per step" in rule.message and "train.steps_per_execution=32" in rule.fix
    assert (
        check(data_dir, "train.steps_per_execution=32", tmp_path=tmp_path)["train.steps_per_execution"].status
        == engine.PASS
    )
    auto = check(data_dir, "train.steps_per_execution=auto", tmp_path=tmp_path)["train.steps_per_execution"]
    assert auto.status == engine.PASS and "last run chose 4" in auto.message
    (run / "metrics.json").write_text(json.dumps({"examples_per_second": 128 / 0.5}))  # 500 ms per step
    assert (
        check(data_dir, "train.steps_per_execution=8", tmp_path=tmp_path)["train.steps_per_execution"].status
        == engine.PASS
    )


# ----------------------------------------------------------------------------- the TPU VM


@pytest.fixture
def fake_vm(tmp_path):
    """Device files, a lock file path and a /proc tree under tmp_path."""
    dev = tmp_path / "dev"
    dev.mkdir()
    devices = []
    for index in range(4):
        (dev / f"accel{index}").touch()
        devices.append(str((dev / f"accel{index}").resolve()))
    proc = tmp_path / "proc"
    proc.mkdir()
    return {
        "devices": devices,
        "lock": str(tmp_path / "libtpu_lockfile"),
        "proc": str(proc),
        "globs": (str(dev / "accel[0-9]*"),),
    }


def _hold(proc: str, pid: int, target: str, command: bytes) -> None:
    fd = Path(proc, str(pid), "fd")
    fd.mkdir(parents=True)
    (fd / "3").symlink_to(target)
    Path(proc, str(pid), "cmdline").write_bytes(command)


def test_stale_lock_file_warns_with_make_tpu_cleanup(fake_vm):
    Path(fake_vm["lock"]).touch()
    _hold(fake_vm["proc"], 4242, "/dev/null", b"python\0unrelated.py")
    verdict = tpu_vm.check_lock_file(fake_vm["lock"], fake_vm["devices"], fake_vm["proc"])
    assert verdict.status == engine.WARN and "stale lock file" in verdict.message
    assert verdict.fix == "make tpu-cleanup"
    assert "\ntpu-cleanup:" in (PROJECT / "tpu.mk").read_text()  # the target the fix names


def test_a_process_holding_the_tpu_is_named(fake_vm):
    Path(fake_vm["lock"]).touch()
    _hold(fake_vm["proc"], 4242, fake_vm["devices"][2], b"python\0-m\0train")
    verdict = tpu_vm.check_lock_file(fake_vm["lock"], fake_vm["devices"], fake_vm["proc"])
    assert verdict.status == engine.WARN and "pid 4242 (python -m train)" in verdict.message
    assert "make tpu-cleanup" in verdict.fix


def test_no_lock_and_no_holder_passes(fake_vm):
    assert tpu_vm.check_lock_file(fake_vm["lock"], fake_vm["devices"], fake_vm["proc"]).status == engine.PASS


def test_tpu_device_files(fake_vm):
    assert tpu_vm.device_files(fake_vm["globs"]) == fake_vm["devices"]
    assert tpu_vm.check_tpu_devices(fake_vm["devices"], 4).status == engine.PASS
    assert tpu_vm.check_tpu_devices(fake_vm["devices"], 8).status == engine.WARN
    missing = tpu_vm.check_tpu_devices([], 4)
    assert missing.status == engine.FAIL and "no TPU device files" in missing.message


def test_tpu_software_versions():
    good = {"tensorflow": None, "tensorflow-tpu": "2.20.0", "libtpu": "0.0.14", "libtpu-nightly": None}
    assert tpu_vm.check_software(good, ["2.19.1", "2.20.0"]).status == engine.PASS
    assert "tensorflow-tpu 2.20.0, libtpu 0.0.14" in tpu_vm.check_software(good, ["2.20.0"]).message
    assert tpu_vm.check_software(good, ["2.19.1", "2.21.0"]).status == engine.WARN
    for broken in ({**good, "tensorflow-tpu": None}, {**good, "libtpu": None}, {**good, "tensorflow": "2.20.0"}):
        verdict = tpu_vm.check_software(broken, ["2.20.0"])
        assert verdict.status == engine.FAIL and "make setup" in verdict.fix
    # Every set of requirements.txt counts: the default's and the TPU VM default's tensorflow.
    text = (PROJECT / "requirements.txt").read_text()
    pinned = tpu_vm._pinned_tensorflow(PROJECT / "requirements.txt")
    assert f"tensorflow=={pinned[-1]}" in text.splitlines() and f"tensorflow=={pinned[0]}" in text, pinned
    assert len(pinned) == 2


@pytest.mark.parametrize(
    "tpu_type, version, supported, found, fix",
    [
        # Google's TF tests ran 2.18 on v4, v5e and v5p; Keras names 2.19.1 the last TF for TPUs.
        ("v5litepod-8", "2.19.1", True, "TF 2.18", ""),
        ("v4-8", "2.18.0", True, "v4-8 and v4-32", ""),
        ("v5p-8", "2.19.1", True, "v5p-8", ""),
        # Newer than any source shows on a TPU.
        ("v5litepod-8", "2.20.0", False, "newer than any TF", "make setup TF=2.19"),
        # No Google source for TF on v6e; none at all on TPU7x.
        ("v6e-8", "2.19.1", False, "no Google source", "v5p-8, v5litepod-8 or v4-8"),
        ("tpu7x-8", "2.19.1", False, "TensorFlow is not supported", "JAX and PyTorch"),
        # A Pod slice's workers run a tpu-vm-tf-*-pod-pjrt image: Google documents them up to 2.18.0.
        ("v4-32", "2.19.1", False, "tpu-vm-tf-2.19.1-pod-pjrt", "make tpu-versions"),
        ("v5litepod-16", "2.18.0", True, "v5e-16", ""),
    ],
)
def test_the_support_matrix_warns_where_no_source_supports_the_combination(tpu_type, version, supported, found, fix):
    hosts = 1 if tpu_type.startswith("tpu7x") else topology.topology(tpu_type).hosts
    finding = support.check(tpu_type, version, hosts)
    assert finding.supported is supported, finding
    assert found in finding.message and f"TF {version} on {tpu_type}" in finding.message, finding.message
    assert fix in finding.fix and bool(finding.fix) is not supported


def test_the_readmes_support_matrix_says_what_the_doctor_says():
    """README.md's matrix: each row's hosts are the topology's, and its verdict for the TPU VM default
    set is the one tpu.support gives; every generation of core/support.py has a row."""
    import re

    from {{ cookiecutter.package }}.core import tensorflow_sets

    sets = tensorflow_sets.load(PROJECT / "requirements.txt")
    version = sets.tensorflow(sets.tpu_default)
    section = (PROJECT / "README.md").read_text().split("## Which TPU, which TensorFlow\n")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `?([A-Za-z0-9-]+)`? \| *(\d*) *\|.*\| (PASS|WARN)\b[^|]*\|$", section, re.MULTILINE)
    assert f"`make doctor` (TF {version})" in section
    assert {name.split("-")[0].lower() for name, _, _ in rows} == set(support.GENERATIONS), rows
    for name, hosts, said in rows:
        tpu_type = name if "-" in name else f"{name.lower()}-8"
        hosts = int(hosts) if hosts else 1
        if support.GENERATIONS[tpu_type.split("-")[0]].tensorflow:
            assert hosts == topology.topology(tpu_type).hosts, name
        assert said == ("PASS" if support.check(tpu_type, version, hosts).supported else "WARN"), name


def test_the_support_rule_checks_the_tensorflow_a_tpu_vm_would_run(data_dir, tmp_path, monkeypatch):
    """Off a TPU VM, the set `make setup` installs on one: its default (2.19) or TF=...; a TPU7x type
    warns under a CPU target, and is refused in one line as a TPU target."""
    monkeypatch.delenv("TF", raising=False)
    results = check(data_dir, tmp_path=tmp_path, tpu_type="v5litepod-8")
    assert results["tpu.support"].status == engine.PASS, results["tpu.support"]
    assert "TF 2.19.1 on v5litepod-8" in results["tpu.support"].message
    assert "(TF 2.19.1: the TPU VM default set of make setup)" in results["tpu.support"].message
    monkeypatch.setenv("TF", "2.20")
    results = check(data_dir, tmp_path=tmp_path, tpu_type="v5litepod-8")
    assert results["tpu.support"].status == engine.WARN and "TF 2.20.0 on v5litepod-8" in results["tpu.support"].message
    assert "(TF 2.20.0: the set make setup TF=2.20 installs)" in results["tpu.support"].message
    monkeypatch.delenv("TF")
    cfg = config.load(str(CONFIGS / "local.yaml"), [f"data.dir={data_dir}", *DATA_OVERRIDES], registry=tasks)
    target = engine.resolve_target(cfg, target="cpu")
    context = engine.Context(cfg, tasks.load(tasks.DEFAULT), target, tpu_type="tpu7x-8")
    verdict = tpu_vm.tpu_support(context)
    assert verdict.status == engine.WARN and "TensorFlow is not supported" in verdict.message
    with pytest.raises(UserError, match=r"^--tpu_type tpu7x-8: Google: TensorFlow is not supported on TPU7x; "):
        engine.resolve_target(cfg, target="tpu", tpu_type="tpu7x-8")


def test_tpu_log_dir(tmp_path):
    assert tpu_vm.check_log_dir(str(tmp_path)).status == engine.PASS
    assert "created on first use" in tpu_vm.check_log_dir(str(tmp_path / "new" / "logs")).message
    not_a_dir = tmp_path / "file"
    not_a_dir.touch()
    verdict = tpu_vm.check_log_dir(str(not_a_dir))
    assert verdict.status == engine.WARN and "TPU_LOG_DIR" in verdict.fix


def test_tpu_vm_rules_skip_off_a_tpu_vm_and_run_on_one(data_dir, tmp_path, fake_vm, monkeypatch):
    monkeypatch.setattr(topology, "TPU_DEVICE_GLOBS", fake_vm["globs"])
    monkeypatch.setattr(tpu_vm, "LOCK_FILE", fake_vm["lock"])
    monkeypatch.setenv("TPU_LOG_DIR", str(tmp_path / "tpu_logs"))
    Path(fake_vm["lock"]).touch()
    # The packages a TPU VM's `make setup` installs (this machine has the CPU build instead).
    pinned = tpu_vm._pinned_tensorflow()[0]
    tpu_packages = {"tensorflow": None, "tensorflow-tpu": pinned, "libtpu": "0.0.14", "libtpu-nightly": None}
    monkeypatch.setattr(
        tpu_vm, "installed_versions", lambda names=(): {name: tpu_packages[name] for name in names or tpu_packages}
    )
    on_vm = check(data_dir, tmp_path=tmp_path, target="tpu", tpu_type="v4-8", on_tpu_vm=True)
    assert on_vm["tpu.devices"].status == engine.PASS and "4 TPU device files" in on_vm["tpu.devices"].message
    assert on_vm["tpu.lock_file"].status == engine.WARN and on_vm["tpu.lock_file"].fix == "make tpu-cleanup"
    assert on_vm["tpu.log_dir"].status == engine.PASS
    assert on_vm["tpu.software"].status == engine.PASS
    assert f"tensorflow-tpu {pinned}, libtpu 0.0.14" in on_vm["tpu.software"].message
    assert on_vm["tpu.support"].message.endswith(f"(TF {pinned}: installed)"), on_vm["tpu.support"]
    off_vm = check(data_dir, tmp_path=tmp_path)
    for rule in ("tpu.devices", "tpu.software", "tpu.lock_file", "tpu.log_dir"):
        assert off_vm[rule].status == engine.SKIP and off_vm[rule].message == engine.NOT_A_TPU_VM


def test_preemption_window_uses_the_last_run(data_dir, tmp_path):
    """Execution time plus checkpoint save time of the last run must fit a Spot VM's 30 s."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  steps_per_execution: 100\n  global_batch_size: 128\n")
    (run / "metrics.json").write_text(json.dumps({"examples_per_second": 128.0, "checkpoint_save_seconds": 2.0}))
    rule = check(data_dir, output_dir=str(run))["train.preemption_window"]
    assert rule.status == engine.WARN and "= 102.0 s" in rule.message and "train.max_seconds_per_execution=" in rule.fix
    (run / "metrics.json").write_text(json.dumps({"examples_per_second": 12800.0, "checkpoint_save_seconds": 2.0}))
    assert check(data_dir, output_dir=str(run))["train.preemption_window"].status == engine.PASS
    assert check(data_dir, output_dir=str(tmp_path / "no-run"))["train.preemption_window"].status == engine.SKIP


def test_host_input_capacity_against_the_last_run(data_dir, tmp_path):
    """The host's real input, run for two seconds, against what the last run's chips consumed."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  steps_per_execution: 4\n  global_batch_size: 128\n")
    (run / "metrics.json").write_text(json.dumps({"examples_per_second": 1e9}))  # chips no host could feed
    rule = check(data_dir, output_dir=str(run))["input.host_capacity"]
    assert rule.status == engine.WARN and "input-bound" in rule.message and "num_shards" in rule.fix
    (run / "metrics.json").write_text(json.dumps({"examples_per_second": 1.0}))
    assert check(data_dir, output_dir=str(run))["input.host_capacity"].status == engine.PASS
    assert check(data_dir, output_dir=str(tmp_path / "no-run"))["input.host_capacity"].status == engine.SKIP


def test_doctor_warns_when_the_last_run_did_not_beat_its_best_baseline(data_dir, tmp_path):
    """train.baselines reads the last run's metrics.json: below the best baseline is a warning with
    what to try, at or above it a pass, no run a skip."""
    task = tasks.load(tasks.DEFAULT)
    found = json.loads((data_dir / "manifest.json").read_text())["baselines"]
    name, score = baselines.best(found)
    worse, better = (score - 0.05, score) if task.higher_is_better else (score * 1.5, score * 0.9)
    run = tmp_path / "run"
    run.mkdir()
    for value, status in ((worse, engine.WARN), (better, engine.PASS)):
        record = {task.headline_metric: value, "global_step": 100, **baselines.summary(value, found)}
        (run / "metrics.json").write_text(json.dumps(record))
        rule = check(data_dir, output_dir=str(run))["train.baselines"]
        assert rule.status == status, rule
        assert f"eval {task.headline_metric} {value:.4f} at step 100; baselines: " in rule.message
    (run / "metrics.json").write_text(json.dumps({task.headline_metric: worse, **baselines.summary(worse, found)}))
    rule = check(data_dir, output_dir=str(run))["train.baselines"]
    assert f"does not beat the {name} baseline" in rule.message and "train.total_steps=" in rule.fix
    assert rule.fix.endswith(f"; {task.baseline_advice}" if task.baseline_advice else "a larger model")
    assert check(data_dir, output_dir=str(tmp_path / "no-run"))["train.baselines"].status == engine.SKIP
