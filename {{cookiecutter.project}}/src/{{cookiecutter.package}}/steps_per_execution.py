"""Measured choice of `steps_per_execution` (`train.steps_per_execution: auto`).

Each call from Python into the device has a fixed cost (dispatch, and on a TPU the host-device
round trip); running several steps per call inside one compiled loop amortises it. Too large a
value delays logging, checkpoints and the SIGTERM check, which all happen between executions.
So: time each candidate (powers of four up to the logging/checkpoint interval) on the real model,
strategy and input, and keep the smallest one within 5% of the fastest. Candidates whose execution
would take longer than `train.max_seconds_per_execution` at the measured step time are not tried:
a preemption notice waits for the current execution to finish, then for a checkpoint save, and
both must fit in the ~30 s a Spot TPU VM gets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

TOLERANCE = 0.05


@dataclass
class Measurement:
    steps_per_execution: int
    steps_per_second: float


def candidates(limit: int) -> list[int]:
    """1, 4, 16, ... below `limit`, and `limit` itself: each candidate costs a compilation, and a
    factor of 4 between them is fine enough to land within a few percent of the best."""
    values, value = [], 1
    while value < limit:
        values.append(value)
        value *= 4
    return values + [limit]


def measure(model, iterator, steps_per_execution: int, min_seconds: float) -> Measurement:
    """Steps per second of `model`'s train function at `steps_per_execution`, after a warm-up call
    (the first call traces and compiles)."""
    model.steps_per_execution = steps_per_execution
    train_function = model.make_train_function(force=True)
    train_function(iterator)["loss"].numpy()  # compile and warm up
    executions, started = 0, time.perf_counter()
    while True:
        train_function(iterator)["loss"].numpy()
        executions += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds and executions >= 2:
            return Measurement(steps_per_execution, executions * steps_per_execution / elapsed)


def choose(measurements: list[Measurement]) -> Measurement:
    """The smallest candidate within TOLERANCE of the fastest."""
    best = max(m.steps_per_second for m in measurements)
    return min(
        (m for m in measurements if m.steps_per_second >= (1 - TOLERANCE) * best), key=lambda m: m.steps_per_execution
    )


def calibrate(
    build_model: Callable,
    make_iterator: Callable,
    limit: int,
    min_seconds: float = 1.5,
    max_seconds_per_execution: float | None = None,
):
    """Times each candidate on a throwaway model; returns (chosen, all measurements).

    `build_model()` returns a compiled model (in the strategy's scope) and `make_iterator()` an
    iterator over the distributed training data. The model is discarded afterwards so that the
    calibration steps never touch the weights that are trained.
    """
    model, iterator = build_model(), make_iterator()
    measurements, cap = [], limit
    for value in candidates(limit):
        if value > cap:
            break
        measurements.append(measure(model, iterator, value, min_seconds))
        if max_seconds_per_execution:
            # Steps that fit in the time bound, at the latest (most amortised) measured rate.
            cap = min(cap, max(1, int(max_seconds_per_execution * measurements[-1].steps_per_second)))
    chosen = choose(measurements)
    del model, iterator
    return chosen, measurements
