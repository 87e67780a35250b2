"""Which precision a run computes in: `runtime.mixed_precision` is `auto`, `bfloat16` or `float32`.

Under `bfloat16` (Keras' mixed_bfloat16 policy) the layers compute in bfloat16 and keep float32
variables, and every task returns float32 logits and loss: no loss scaling is needed, unlike
float16. It is the TPU's native type, and the code path the CPU tests exercise.

`auto` picks bfloat16 where the hardware computes it natively and float32 elsewhere:
- a TPU: bfloat16 (the MXU's input type);
- a GPU: bfloat16 from compute capability 8.0 (Ampere) on, float32 before;
- a CPU: bfloat16 with the `avx512_bf16` or `amx_bf16` flags (x86: Cooper Lake, Sapphire Rapids
  and later, Zen 4 and later) or `bf16` (Arm: Graviton3, Neoverse V1 and later), through oneDNN.
  Without them TensorFlow emulates bfloat16, and a convolution's training step ran ~10x slower
  than in float32 on an AVX2-only AMD EPYC (Zen 3, the CPU of common hosted CI runners).

This module reads the CPU flags without importing TensorFlow, so `make doctor` can use it too.
"""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass

CHOICES = ("auto", "bfloat16", "float32")
NATIVE_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# ONEDNN_MAX_CPU_ISA caps the instructions oneDNN uses; these levels (and the default, no cap)
# include bfloat16 arithmetic. Under a lower one (AVX2, AVX512_CORE, ...) TensorFlow still sends
# bfloat16 convolutions to oneDNN on such a CPU, which then fails to create them: float32 it is.
ONEDNN_BF16_ISAS = {
    "ALL",
    "DEFAULT",
    "AVX512_CORE_BF16",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
}
MIN_GPU_COMPUTE_CAPABILITY = (8, 0)
CPUINFO = "/proc/cpuinfo"


@dataclass(frozen=True)
class Choice:
    """The precision a run uses and why, in words for the start-up line."""

    precision: str
    """`bfloat16` or `float32`."""
    reason: str

    def describe(self) -> str:
        return f"{self.precision} ({self.reason})"


def cpu_flags(path: str = CPUINFO) -> set[str] | None:
    """The CPU's feature flags (`flags` on x86, `Features` on Arm), or None where they cannot be read."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def cpu_bfloat16(flags: set[str] | None, environ=os.environ) -> tuple[bool, str]:
    """(whether a CPU with `flags` (None: unreadable) computes bfloat16 natively for TensorFlow, what
    decided it)."""
    if flags is None:
        return False, f"the CPU flags of this {platform.system() or 'machine'} cannot be read"
    native = sorted(flag for flag in NATIVE_CPU_FLAGS if flag in flags)
    if not native:
        return False, f"this CPU has no native bfloat16 (none of the {'/'.join(NATIVE_CPU_FLAGS)} flags)"
    if environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip() == "0":
        return False, f"this CPU has {'/'.join(native)}, but TF_ENABLE_ONEDNN_OPTS=0 turns off the oneDNN kernels"
    cap = environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap and cap not in ONEDNN_BF16_ISAS and "bf16" not in native:
        return False, f"this CPU has {'/'.join(native)}, but ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN from it"
    return True, f"this CPU has native bfloat16 ({'/'.join(native)})"


def gpu_bfloat16(compute_capability: tuple[int, int] | None) -> tuple[bool, str]:
    if compute_capability is None:
        return False, "the GPU's compute capability is unknown"
    major, minor = compute_capability
    if tuple(compute_capability) >= MIN_GPU_COMPUTE_CAPABILITY:
        return True, f"this GPU (compute capability {major}.{minor}) has native bfloat16"
    return False, f"this GPU (compute capability {major}.{minor}, under 8.0) has no native bfloat16"


def _gpu_compute_capability() -> tuple[int, int] | None:
    import tensorflow as tf

    from .distribute import devices_of

    gpus = devices_of("GPU")
    if not gpus:
        return None
    return tf.config.experimental.get_device_details(gpus[0]).get("compute_capability")


_THIS_MACHINE = object()


def native(kind: str, *, flags=_THIS_MACHINE, compute_capability=_THIS_MACHINE) -> tuple[bool, str]:
    """Whether the `kind` ('tpu', 'gpu', 'cpu') of this machine computes bfloat16 natively, and why;
    `flags` and `compute_capability` describe another machine (tests)."""
    if kind == "tpu":
        return True, "a TPU computes bfloat16 natively"
    if kind == "gpu":
        return gpu_bfloat16(_gpu_compute_capability() if compute_capability is _THIS_MACHINE else compute_capability)
    return cpu_bfloat16(cpu_flags() if flags is _THIS_MACHINE else flags)


def choose(requested: str, kind: str, **facts) -> Choice:
    """The precision for `runtime.mixed_precision=requested` on a `kind` target; `facts` are
    `flags` or `compute_capability` where the caller knows them (tests, `make doctor`)."""
    has_native, why = native(kind, **facts)
    if requested == "auto":
        if has_native:
            return Choice("bfloat16", f"auto: {why}")
        return Choice(
            "float32",
            f"auto: {why}; bfloat16 would be emulated, several times slower here (set "
            "runtime.mixed_precision=bfloat16 to run the TPU's numerics anyway)",
        )
    if requested == "bfloat16" and not has_native:
        return Choice("bfloat16", f"runtime.mixed_precision; emulated: {why}, so several times slower than float32")
    return Choice(requested, "runtime.mixed_precision")


def set_policy(precision: str) -> None:
    """`bfloat16`: layers compute in bfloat16 and keep float32 variables; `float32`: everything in float32."""
    from .keras import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bfloat16" else "float32")


@contextlib.contextmanager
def policy(name: str):
    """Keras' global policy `name` ("float32", "mixed_bfloat16") for the block, then the one before."""
    from .keras import keras

    found = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(found)


def apply(requested: str, kind: str) -> Choice:
    """Chooses the precision for this machine's `kind` target and sets Keras' policy to it."""
    choice = choose(requested, kind)
    set_policy(choice.precision)
    return choice
