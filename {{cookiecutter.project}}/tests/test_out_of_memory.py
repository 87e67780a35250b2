"""Running out of device memory is one line on every path a run takes: the calibration of
steps_per_execution, the first execution, the periodic and the final evaluation, `make eval` and
the export. The model's step asks for memory it cannot get (a MemoryError inside the step's graph,
which TensorFlow raises as a ResourceExhaustedError, as a chip's allocator does) and runs through
the real trainer; where the error came from is read from the traceback that the one line replaces.
A run also sets the device's measured peak beside the plan, on a GPU or TPU only.
"""

import traceback

import pytest
import tensorflow as tf

from conftest import REPLICAS, config_file, tiny_config
from {{ cookiecutter.package }} import evaluate, parity, tasks
from {{ cookiecutter.package }}.core import config, levers, memory, trainer
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.core.topology import Target


def run_out_of_memory():
    raise MemoryError("Ran out of memory in memory space hbm")


# What the one line quotes of TensorFlow's error: its line that says what ran out, not the first
# ("Graph execution error:", then the frames of the graph's traceback).
MEMORY_ERROR = "MemoryError: Ran out of memory in memory space hbm"


def exhausting(build, step: str):
    """`build` (a build_model) whose models run out of memory in every call of `step` ('train_step'
    or 'test_step'), before the real step."""

    def build_exhausting(cfg, task, manifest):
        model = build(cfg, task, manifest)
        real_step = getattr(model, step)

        def exhausted_step(data):
            tf.py_function(run_out_of_memory, [], [])
            return real_step(data)

        setattr(model, step, exhausted_step)
        return model

    return build_exhausting


def assert_one_line(
    raised: pytest.ExceptionInfo, cfg, *where: tuple[str, str], precision: str = "float32", quoted: str = MEMORY_ERROR
) -> None:
    """The UserError is the one line (TensorFlow's news `quoted`, the estimate and the levers of the
    run's `precision`), and the error it replaces was raised through each (file, function) of `where`."""
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"out of device memory at {cfg.train.global_batch_size // 8} examples per replica ({quoted}); "
    )
    assert "; the step needs about " in message and " per replica (weights " in message
    # bfloat16 is a lever of a float32 run only.
    assert ("runtime.mixed_precision=bfloat16 (" in message) == (precision == "float32")
    assert message.endswith(
        f"`make doctor` shows the plan and what each lever saves: {levers.describe(cfg, precision)}"
    )
    error = raised.value.__context__
    assert isinstance(error, tf.errors.ResourceExhaustedError)
    frames = {
        (frame.f_code.co_filename.rsplit("/", 1)[-1], frame.f_code.co_name)
        for frame, _ in traceback.walk_tb(error.__traceback__)
    }
    assert set(where) <= frames, f"not raised through {sorted(set(where) - frames)}"


def exhausting_config(data_dir, output_dir, *overrides, precision: str = "float32"):
    # float32 by default: the levers include bfloat16, whatever this CPU would choose.
    return tiny_config(data_dir, output_dir, f"runtime.mixed_precision={precision}", *overrides)


def test_out_of_memory_during_calibration_is_one_line(data_dir, tmp_path, monkeypatch):
    cfg = exhausting_config(
        data_dir, tmp_path / "run", "train.steps_per_execution=auto:fresh", f"runtime.cache_dir={tmp_path / 'cache'}"
    )
    monkeypatch.setattr(trainer, "build_model", exhausting(trainer.build_model, "train_step"))
    with pytest.raises(UserError) as raised:
        trainer.train(cfg, tasks.load(cfg.task))
    assert_one_line(
        raised, cfg, ("trainer.py", "settle_steps_per_execution"), ("steps_per_execution.py", "loop_function")
    )


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_out_of_memory_in_the_first_execution_is_one_line(data_dir, tmp_path, monkeypatch, precision):
    """In bfloat16 (a TPU's run) the line offers no bfloat16: the levers are the precision's that runs."""
    cfg = exhausting_config(data_dir, tmp_path, precision=precision)
    monkeypatch.setattr(trainer, "build_model", exhausting(trainer.build_model, "train_step"))
    with pytest.raises(UserError) as raised:
        trainer.train(cfg, tasks.load(cfg.task))
    assert_one_line(raised, cfg, ("trainer.py", "fit"), precision=precision)


def test_out_of_memory_in_a_periodic_evaluation_is_one_line(data_dir, tmp_path, monkeypatch):
    cfg = exhausting_config(data_dir, tmp_path, "train.total_steps=8", "train.eval_every=4")
    monkeypatch.setattr(trainer, "build_model", exhausting(trainer.build_model, "test_step"))
    with pytest.raises(UserError) as raised:
        trainer.train(cfg, tasks.load(cfg.task))
    assert_one_line(
        raised, cfg, ("trainer.py", "fit"), ("callbacks.py", "on_execution_end"), ("evaluation.py", "evaluate_model")
    )


def test_out_of_memory_in_the_final_evaluation_make_eval_and_the_export_is_one_line(data_dir, tmp_path, monkeypatch):
    cfg = exhausting_config(data_dir, tmp_path, "train.total_steps=4", "train.eval_every=0")
    with monkeypatch.context() as patch:
        patch.setattr(trainer, "build_model", exhausting(trainer.build_model, "test_step"))
        with pytest.raises(UserError) as raised:
            trainer.train(cfg, tasks.load(cfg.task))
    assert_one_line(raised, cfg, ("trainer.py", "final_evaluation"), ("evaluation.py", "evaluate_model"))
    # The last checkpoint was saved before the evaluation: `make eval` evaluates it.
    with monkeypatch.context() as patch:
        patch.setattr(evaluate, "build_model", exhausting(evaluate.build_model, "test_step"))
        with pytest.raises(UserError) as raised:
            evaluate.main(["--config", str(tmp_path / "config.yaml")])
    assert_one_line(raised, cfg, ("evaluate.py", "main"), ("evaluation.py", "evaluate_model"))

    # Run again, the run is finished: evaluated, then exported.
    def build_serving_signature(*args):
        raise tf.errors.ResourceExhaustedError(None, None, "Ran out of memory in memory space hbm")

    monkeypatch.setattr(tasks.load(cfg.task), "build_serving_signature", build_serving_signature)
    with pytest.raises(UserError) as raised:
        trainer.train(config.load(str(tmp_path / "config.yaml"), registry=tasks), tasks.load(cfg.task))
    assert_one_line(
        raised, cfg, ("trainer.py", "finish"), ("run_dir.py", "export"), quoted="Ran out of memory in memory space hbm"
    )


def test_out_of_memory_in_parity_is_one_line_with_the_one_device_side_planned(data_dir, tmp_path, monkeypatch):
    """Parity's one-device side trains the whole global batch on one replica's memory: the line plans
    that (float32, 32 examples) and gives the global batch one replica holds (32 // 8 // 8 x 8 is 0:
    at least one example per replica, 8)."""
    monkeypatch.setattr(parity, "build_model", exhausting(parity.build_model, "train_step"))
    overrides = [*tasks.load(tasks.DEFAULT).testing().overrides, "train.global_batch_size=32"]
    base = [f"data.dir={data_dir}", f"runtime.output_dir={tmp_path}", f"runtime.cpu_devices={REPLICAS}"]
    with pytest.raises(UserError) as raised:
        parity.main(["--config", str(config_file(tasks.DEFAULT)), "--steps", "1", *base, *overrides])
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"out of device memory in parity ({MEMORY_ERROR}); ")
    cfg = tiny_config(data_dir, tmp_path, "runtime.mixed_precision=float32", "train.gradient_accumulation_steps=1")
    planned = memory.estimate_for(cfg, tasks.load(cfg.task), parity_manifest(cfg), 32, 0)
    assert (
        "its one-device side trains each global batch of 32 examples on one replica's memory in float32: that needs "
        f"about {memory.gib(planned.total)} ({planned.breakdown()}); check with a global batch that one replica "
        "holds: make parity ARGS=train.global_batch_size=8"
    ) in message
    error = raised.value.__context__
    assert isinstance(error, tf.errors.ResourceExhaustedError)
    frames = {frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)}
    assert {"main", "compare"} <= frames


@pytest.mark.parametrize("bench", ["bench_input", "bench_spe"])
def test_out_of_memory_in_the_benchmarks_that_train_is_training_s_one_line(data_dir, tmp_path, monkeypatch, bench):
    """`make bench` (its trainer part) and `make bench-spe` train the config's model: running out of
    memory there is training's one line."""
    from {{ cookiecutter.package }} import bench_input, bench_spe
    from {{ cookiecutter.package }}.core import steps_per_execution

    module = {"bench_input": bench_input, "bench_spe": steps_per_execution}[bench]
    monkeypatch.setattr(module, "build_model", exhausting(module.build_model, "train_step"))
    cfg = exhausting_config(data_dir, tmp_path)
    arguments = [f"data.dir={data_dir}", f"runtime.output_dir={tmp_path}", f"runtime.cpu_devices={REPLICAS}"]
    arguments += [*tasks.load(tasks.DEFAULT).testing().overrides, "train.global_batch_size=32"]
    arguments += ["runtime.mixed_precision=float32", "train.log_every=4", f"runtime.cache_dir={tmp_path / 'cache'}"]
    command = {"bench_input": bench_input, "bench_spe": bench_spe}[bench]
    extra = (
        ["--rounds", "1", "--seconds", "0.1", *arguments, "--only", "trainer"] if bench == "bench_input" else arguments
    )
    with pytest.raises(UserError) as raised:
        command.main(["--config", str(config_file(tasks.DEFAULT)), *extra])
    assert_one_line(raised, cfg, (f"{bench}.py", "main"))


def parity_manifest(cfg) -> dict:
    from {{ cookiecutter.package }}.core import input_pipeline

    return input_pipeline.read_manifest(cfg.data.dir, tasks.load(cfg.task), cfg.data)


def test_the_line_quotes_what_ran_out_not_the_traceback_around_it():
    """A TPU's compile-time out-of-memory error on 2 replicas, as TensorFlow words it: the line quotes the
    first replica's news without its number and status; a plain error its first line; an empty one its type."""
    news = (
        "XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 16.97G of 15.48G hbm. "
        "Exceeded hbm capacity by 1.49G."
    )
    tpu = (
        "Graph execution error:\n\nDetected at node train_step defined at (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n\n2 root error(s) found.\n'
        f"  (0) RESOURCE_EXHAUSTED: {news}\n  (1) RESOURCE_EXHAUSTED: {news}\n"
    )
    exhausted = lambda message: tf.errors.ResourceExhaustedError(None, None, message)  # noqa: E731
    assert levers.first_line(exhausted(tpu)) == news
    assert levers.first_line(exhausted("OOM when allocating tensor with shape[8,1024]\nmore")) == (
        "OOM when allocating tensor with shape[8,1024]"
    )
    assert levers.first_line(exhausted("x" * 200)) == "x" * 160
    assert levers.first_line(exhausted("")) == "ResourceExhaustedError"


def test_the_levers_are_those_the_config_does_not_use_yet():
    plain = config.load(None, ["train.optimizer=adamw", "model.remat=false"], registry=tasks)
    assert [lever.setting for lever in levers.unused(plain, "float32")] == [
        "model.remat=true",
        "train.optimizer=adafactor",
        "runtime.mixed_precision=bfloat16",
    ]
    pulled = config.load(None, ["train.optimizer=adafactor", "model.remat=true"], registry=tasks)
    assert levers.unused(pulled, "bfloat16") == []
    assert levers.describe(pulled, "bfloat16") == levers.ACCUMULATION.describe()
    assert all(lever.setting and lever.effect for lever in [*levers.LEVERS, levers.ACCUMULATION])
    batched = config.load(None, ["train.global_batch_size=256", "train.gradient_accumulation_steps=2"], registry=tasks)
    assert levers.accumulation(batched, 4) == "train.global_batch_size=64 train.gradient_accumulation_steps=8"


def test_each_lever_plans_what_it_sets_and_only_a_tpu_has_hbm_to_plan_against():
    """The doctor plans each lever by its `change`: the value its setting names. A replica's HBM is a
    known TPU's; off one (a GPU, a CPU, a TPU of unknown type) there is none, and the line has no
    estimate's 'of N GiB HBM'. An estimate that fails is named, and the line still comes."""
    for lever in levers.LEVERS:
        _, value = lever.setting.split("=")
        (planned,) = lever.change.values()
        assert str(planned).lower() == value, lever.setting
    v5e = Target("tpu", 8, 1, tpu_type="v5litepod-8", chips=8)
    assert levers.replica_hbm_bytes(v5e) == 16 * 10**9  # a v5e chip's 16 GB, one replica a chip
    assert levers.replica_hbm_bytes(Target("gpu", 8, 1, tpu_type="v5litepod-8")) == 0
    assert levers.replica_hbm_bytes(Target("tpu", 8, 1)) == 0
    cfg = config.load(None, [], registry=tasks)
    error = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    line = levers.out_of_memory(cfg, None, {}, Target("cpu", 1, 1), error)
    assert "; no estimate (AttributeError);" in line and "HBM" not in line


def test_the_measured_peak_is_set_beside_the_plan():
    measured = {"peak_memory_bytes": 12 * memory.GIB, "planned_memory_bytes": 10 * memory.GIB}
    assert (
        trainer.describe_memory(measured)
        == "; device memory peak 12.0 GiB per replica against a plan of 10.0 GiB (1.20x)"
    )
    assert (
        trainer.describe_memory({"peak_memory_bytes": 3 * memory.GIB})
        == "; device memory peak 3.00 GiB per replica (no plan)"
    )
