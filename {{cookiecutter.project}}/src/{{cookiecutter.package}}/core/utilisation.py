"""Model FLOPs utilisation: the training step's model FLOPs (counted once from the traced step,
core/memory.py) per second and chip, against the chip's peak. Where the count misses something
(a loop whose length is known only when it runs), the step lines and metrics.json say what
instead of showing a rate.

The peak of a TPU chip is its page's bfloat16 figure (topology.CHIPS), for the generation of the
VM's TPU_ACCELERATOR_TYPE (else the project's TPU type). A CPU has no published
figure that training could reach, so `make bench` measures this host's matrix-multiply peak in
each precision and stores it in `runtime.cache_dir`; a run on this host reads it (a CPU run
counts the whole host as one chip). A GPU's utilisation is not shown: no peak is known here.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time

import tensorflow as tf

from . import memory, topology
from .run_dir import write_atomically
from .steps_per_execution import cache_dir
from .topology import Target


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _host_key(precision: str) -> str:
    return f"{cpu_model()} x{os.cpu_count()} {precision}"


def host_peak_path(configured_cache_dir: str) -> str:
    return f"{cache_dir(configured_cache_dir).rstrip('/')}/host_peak.json"


def measure_host_peak(precision: str, size: int = 2048, seconds: float = 3.0) -> float:
    """FLOP/s of this host's best square matrix multiply of `size` in `precision` (all cores)."""
    dtype = tf.bfloat16 if precision == "bfloat16" else tf.float32
    a = tf.random.normal([size, size], dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)

    @tf.function
    def multiply(x, y):
        return tf.reduce_sum(tf.cast(tf.matmul(x, y)[:1, :1], tf.float32))

    multiply(a, b).numpy()  # trace and warm up
    best, started = 0.0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        began = time.perf_counter()
        multiply(a, b).numpy()
        best = max(best, 2 * size**3 / (time.perf_counter() - began))
    return best


def store_host_peak(configured_cache_dir: str, precision: str, flops: float) -> str:
    """Adds this host's peak in `precision` to the record of peaks, written whole or not at all
    (`write_atomically`): a write that fails or is killed leaves the record before it."""
    path = host_peak_path(configured_cache_dir)
    stored = _read(path)
    stored[_host_key(precision)] = flops
    tf.io.gfile.makedirs(os.path.dirname(path))
    write_atomically(path, json.dumps(stored, indent=2, sort_keys=True) + "\n")
    return path


def _read(path: str) -> dict:
    try:
        with tf.io.gfile.GFile(path) as handle:
            value = json.load(handle)
        return value if isinstance(value, dict) else {}
    except (tf.errors.NotFoundError, ValueError):
        return {}


def step_flops(model, cfg, target: Target) -> tuple[float, tuple[str, ...]]:
    """(model FLOPs of one optimizer step, what could not be counted). The FLOPs are what the log's
    TFLOP/s and MFU divide: 3 x the matrix multiplies of the forward pass per example (core/memory.py;
    a loop's body, such as an LSTM's step, times the loop's length), less the weight gradients of
    the frozen weights' multiplies (`train.freeze`), times the examples of an update (the global
    batch times `train.gradient_accumulation_steps`). The input gradient of a frozen layer that no
    trained layer lies below is counted although the step need not compute it.

    Counted from the model's inference call: the multiplies of a task's step loss (e.g. a dual
    encoder's in-batch similarity) and of its loss are not counted, nor is the forward pass that
    `model.remat` computes again (hardware FLOPs, not model FLOPs). What could not be counted
    names where (a loop whose length is known only when it runs, e.g. over a sequence of unknown
    length): with it the count is too low to show."""
    per_replica = target.per_replica_batch_size(cfg.train.global_batch_size)
    forward = memory.count_forward(model, per_replica)
    return forward.training / per_replica * cfg.effective_batch_size, forward.unknown


def flops_per_step(model, cfg, target: Target) -> float:
    """`step_flops`' count (too low where it names something it could not count)."""
    return step_flops(model, cfg, target)[0]


def chips(target: Target) -> int:
    """What "per chip" divides by: TPU chips, GPUs, or the one host of a CPU run."""
    if target.kind == "tpu":
        return target.chips or topology.chips_of(target.tpu_type, target.replicas) or target.replicas
    return target.replicas if target.kind == "gpu" else 1


def peak_per_chip(target: Target, precision: str, configured_cache_dir: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one chip, where it comes from); None when unknown."""
    if target.kind == "tpu":
        generation = target.tpu_type.split("-")[0]
        if generation not in topology.CHIPS:
            return None, f"no peak known for TPU type {target.tpu_type!r}"
        chip = topology.CHIPS[generation]
        return chip.peak_bf16_flops, f"{generation} bfloat16 peak ({chip.source})"
    if target.kind == "cpu":
        measured = _read(host_peak_path(configured_cache_dir)).get(_host_key(precision))
        if isinstance(measured, (int, float)) and measured > 0:
            return float(measured), f"this host's measured {precision} matrix-multiply peak (make bench)"
        return None, f"no measured {precision} peak for this host yet: `make bench` measures it"
    return None, "no peak known for this GPU"


class Utilisation:
    """TFLOP/s per chip and model FLOPs utilisation of a rate of training steps; neither where the
    model's FLOPs are `unknown` (what could not be counted, each naming where)."""

    def __init__(
        self,
        flops_per_step: float,
        target: Target,
        precision: str,
        configured_cache_dir: str,
        unknown: tuple[str, ...] = (),
    ):
        self.flops_per_step, self.chips, self.unknown = flops_per_step, chips(target), tuple(unknown)
        self.peak, self.peak_source = peak_per_chip(target, precision, configured_cache_dir)

    def tflops_per_chip(self, steps_per_second: float) -> float | None:
        if self.unknown:
            return None
        return self.flops_per_step * steps_per_second / self.chips / 1e12

    def mfu(self, steps_per_second: float) -> float | None:
        if not self.peak or self.unknown:
            return None
        return self.flops_per_step * steps_per_second / self.chips / self.peak

    def describe(self) -> str:
        """The line after the first execution: the step's model FLOPs and what they are set against."""
        if self.unknown:
            return f"model FLOPs unknown: {'; '.join(self.unknown)}; no TFLOP/s or utilisation"
        flops = f"model FLOPs {figure(self.flops_per_step / 1e9, 2)} GFLOP per step"
        if self.peak:
            return f"{flops}; utilisation (MFU) against {self.peak / 1e12:.2f} TFLOP/s per chip, {self.peak_source}"
        return f"{flops}; no utilisation: {self.peak_source}"

    def describe_rate(self, steps_per_second: float) -> str:
        """A step line's part: TFLOP/s per chip and MFU at the rate, or why there are none."""
        tflops = self.tflops_per_chip(steps_per_second)
        if tflops is None:
            return f"model FLOPs unknown: {'; '.join(self.unknown)}"
        mfu = self.mfu(steps_per_second)
        return f"{figure(tflops):>7} TFLOP/s/chip" + (f"  MFU {mfu:6.1%}" if mfu is not None else "")

    def metrics(self, steps_per_second: float) -> dict:
        """For the run's metrics.json: `tflops_per_chip` and `model_flops_utilization` (where a peak
        is known) at the rate, to 4 significant digits, or `model_flops_unknown` saying what could
        not be counted."""
        if self.unknown:
            return {"model_flops_unknown": "; ".join(self.unknown)}
        found = {"tflops_per_chip": float(f"{self.tflops_per_chip(steps_per_second):.4g}")}
        mfu = self.mfu(steps_per_second)
        if mfu is not None:
            found["model_flops_utilization"] = float(f"{mfu:.4g}")
        return found


def of_model(model, cfg, target: Target) -> Utilisation:
    """The utilisation of training `model` as `cfg` does on `target` (the step's FLOPs counted from
    the traced model, `step_flops`)."""
    flops, unknown = step_flops(model, cfg, target)
    return Utilisation(flops, target, cfg.runtime.mixed_precision, cfg.runtime.cache_dir, unknown)


def figure(value: float, decimals: int = 3) -> str:
    """`value` with `decimals` decimals, more for a small one (4 significant digits): a small
    model's TFLOP/s on a CPU reads 0.0004712, not 0.000."""
    if value and math.isfinite(value) and abs(value) < 1:
        decimals = max(decimals, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"
