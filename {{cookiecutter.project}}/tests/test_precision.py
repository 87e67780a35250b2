"""`runtime.mixed_precision: auto`: bfloat16 where the hardware computes it natively, float32 where
it would be emulated, and the reason in words; an explicit value always wins. The choice is Keras'
policy: the layers built after it compute in it, with float32 variables."""

from __future__ import annotations

import pytest

from {{ cookiecutter.package }}.core import precision

ZEN3 = {"fpu", "sse4_2", "avx", "avx2", "fma", "vaes"}  # an AVX2-only AMD EPYC (no AVX-512)
SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
GRAVITON3 = {"fp", "asimd", "sve", "bf16", "i8mm"}


def test_cpu_flags_are_read_from_x86_and_arm_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n"
    )
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\nCPU part\t: 0xd40\n")
    assert precision.cpu_flags(str(x86)) == {"fpu", "avx2", "avx512_bf16"}
    assert precision.cpu_flags(str(arm)) == {"fp", "asimd", "bf16"}
    assert precision.cpu_flags(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    "flags, expected",
    [(ZEN3, "float32"), (SAPPHIRE_RAPIDS, "bfloat16"), (GRAVITON3, "bfloat16"), (set(), "float32")],
)
def test_auto_on_a_cpu_follows_its_native_bfloat16(flags, expected, monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    choice = precision.choose("auto", "cpu", flags=flags)
    assert choice.precision == expected
    if expected == "float32":
        assert "no native bfloat16" in choice.reason and "bfloat16 would be emulated" in choice.reason
    else:
        assert "native bfloat16" in choice.reason


def test_unreadable_cpu_flags_mean_float32():
    choice = precision.choose("auto", "cpu", flags=None)
    assert choice.precision == "float32" and "cannot be read" in choice.reason


@pytest.mark.parametrize(
    "environ, reason",
    [
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "ONEDNN_MAX_CPU_ISA=AVX2"),
        ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, "ONEDNN_MAX_CPU_ISA=AVX512_CORE"),
        ({"TF_ENABLE_ONEDNN_OPTS": "0"}, "TF_ENABLE_ONEDNN_OPTS=0"),
    ],
)
def test_oneDNN_settings_that_exclude_bfloat16_mean_float32(environ, reason):
    ok, why = precision.cpu_bfloat16(SAPPHIRE_RAPIDS, environ=environ)
    assert not ok and reason in why
    assert precision.cpu_bfloat16(SAPPHIRE_RAPIDS, environ={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"})[0]


def test_auto_on_a_tpu_and_on_gpus():
    assert precision.choose("auto", "tpu").precision == "bfloat16"
    a100 = precision.choose("auto", "gpu", compute_capability=(8, 0))
    v100 = precision.choose("auto", "gpu", compute_capability=(7, 0))
    assert a100.precision == "bfloat16" and "compute capability 8.0" in a100.reason
    assert v100.precision == "float32" and "under 8.0" in v100.reason


def test_an_explicit_precision_wins_and_emulation_is_named(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    forced = precision.choose("bfloat16", "cpu", flags=ZEN3)
    assert forced.precision == "bfloat16" and "emulated" in forced.reason
    assert precision.choose("float32", "cpu", flags=SAPPHIRE_RAPIDS).precision == "float32"
    assert precision.choose("float32", "tpu").describe() == "float32 (runtime.mixed_precision)"


@pytest.fixture
def keras_policy():
    """Keras' global policy as the test found it, put back after it (conftest does too, after
    every test)."""
    from {{ cookiecutter.package }}.core.keras import keras

    found = keras.mixed_precision.global_policy()
    yield keras
    keras.mixed_precision.set_global_policy(found)


@pytest.mark.parametrize(
    "flags, policy, compute", [(SAPPHIRE_RAPIDS, "mixed_bfloat16", "bfloat16"), (ZEN3, "float32", "float32")]
)
def test_auto_sets_the_policy_the_layers_compute_in(
    flags, policy, compute, keras_policy, data_dir, tmp_path, monkeypatch
):
    """`auto` on a CPU with (or without) native bfloat16: the layers built after it compute in
    bfloat16 (float32) with float32 variables, the task's model too, bar its float32 logits."""
    import tensorflow as tf

    from conftest import tiny_config
    from {{ cookiecutter.package }} import tasks
    from {{ cookiecutter.package }}.core import input_pipeline
    from {{ cookiecutter.package }}.core.model import build_model

    keras = keras_policy
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda path=precision.CPUINFO: set(flags))
    keras.mixed_precision.set_global_policy("float64" if compute == "float32" else "float32")  # not the answer

    assert precision.apply("auto", "cpu").precision == compute
    assert keras.mixed_precision.global_policy().name == policy
    dense = keras.layers.Dense(3)
    outputs = dense(tf.ones([2, 4]))
    assert dense.compute_dtype == outputs.dtype == compute
    assert dense.kernel.dtype == dense.bias.dtype == "float32"

    cfg = tiny_config(data_dir, tmp_path)
    task = tasks.load(cfg.task)
    model = build_model(cfg, task, input_pipeline.read_manifest(str(data_dir), task, cfg.data))
    weighted = [layer for layer in model.layers if layer.weights]
    computing = [layer.name for layer in weighted if layer.compute_dtype == compute]
    assert len(computing) > len(weighted) / 2, {layer.name: layer.compute_dtype for layer in weighted}
    assert {variable.dtype for variable in model.variables} == {tf.float32}
    assert {output.dtype for output in model.outputs} == {tf.float32}
