"""`runtime.mixed_precision: auto`: bfloat16 where the hardware computes it natively, float32 where
it would be emulated, and the reason in words; an explicit value always wins."""

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
