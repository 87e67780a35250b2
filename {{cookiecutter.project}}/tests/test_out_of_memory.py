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

from conftest import tiny_config
from {{ cookiecutter.package }} import evaluate, tasks
from {{ cookiecutter.package }}.core import config, levers, memory, trainer
from {{ cookiecutter.package }}.core.errors import UserError


def run_out_of_memory():
    raise MemoryError("Ran out of memory in memory space hbm")


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


def assert_one_line(raised: pytest.ExceptionInfo, cfg, *where: tuple[str, str]) -> None:
    """The UserError is the one line (estimate and levers), and the error it replaces was raised
    through each (file, function) of `where`."""
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"out of device memory at {cfg.train.global_batch_size // 8} examples per replica (")
    assert "; the step needs about " in message and " per replica (weights " in message
    assert "runtime.mixed_precision=bfloat16 (" in message  # the run is float32
    assert message.endswith(
        f"`make doctor` shows the plan and what each lever saves: {levers.describe(cfg, 'float32')}"
    )
    error = raised.value.__context__
    assert isinstance(error, tf.errors.ResourceExhaustedError)
    frames = {
        (frame.f_code.co_filename.rsplit("/", 1)[-1], frame.f_code.co_name)
        for frame, _ in traceback.walk_tb(error.__traceback__)
    }
    assert set(where) <= frames, f"not raised through {sorted(set(where) - frames)}"


def exhausting_config(data_dir, output_dir, *overrides):
    # float32: the levers include bfloat16, whatever this CPU would choose.
    return tiny_config(data_dir, output_dir, "runtime.mixed_precision=float32", *overrides)


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


def test_out_of_memory_in_the_first_execution_is_one_line(data_dir, tmp_path, monkeypatch):
    cfg = exhausting_config(data_dir, tmp_path)
    monkeypatch.setattr(trainer, "build_model", exhausting(trainer.build_model, "train_step"))
    with pytest.raises(UserError) as raised:
        trainer.train(cfg, tasks.load(cfg.task))
    assert_one_line(raised, cfg, ("trainer.py", "fit"))


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
    assert_one_line(raised, cfg, ("trainer.py", "finish"), ("run_dir.py", "export"))


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
