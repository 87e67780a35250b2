"""Measured choice of `steps_per_execution` (`train.steps_per_execution: auto`), measured once per setting.

Each call from Python into the device has a fixed cost (dispatch, and on a TPU the host-device
round trip); running several steps per call inside one compiled loop amortises it. Too large a
value delays logging, checkpoints and the SIGTERM check, which all happen between executions.
So: time each candidate (powers of four up to the logging/checkpoint interval) on the real model,
strategy and input, and keep the largest one within 5% of the fastest (more amortisation for the
same speed, and a choice that does not wander with measurement noise). Candidates whose execution
would take longer than `train.max_seconds_per_execution` at the measured step time are not tried:
a preemption notice waits for the current execution to finish, then for a checkpoint save, and
both must fit in the ~30 s a Spot TPU VM gets.

What it costs, and why it is paid once:
- Keras' multi-step train function loops `model.steps_per_execution` times, a variable read inside
  the compiled loop: one compilation serves every candidate, and training reuses it.
- The candidates run on the model that is then trained; its weights and optimizer state are put
  back afterwards (`Snapshot`), so calibration steps never reach the trained weights.
- The choice and its measurements are stored in the run's metrics.json (a resume reuses them) and
  in a cache keyed by everything that determines them (`setting()`), so a rerun, or a new run with
  only another output_dir, measures nothing. `auto:fresh` measures again and renews both.
- Each candidate is timed in `ROUNDS` interleaved rounds and its median kept: a burst of load on
  a shared machine then hits one round of every candidate, not all rounds of one.
- Where a step is long next to the per-call cost (a CPU, a large model), measuring more is wasted:
  once a candidate runs within `NEGLIGIBLE` (5%) of the one before it (with 4x fewer calls per
  step), no larger one can be faster by more than a third of that, so the first round ends there
  and no further rounds are run (`negligible_gain`). On the shipped local run this takes the calibration
  from ~19 s (three rounds of 1, 4 and 16, each execution of 16 steps ~4.5 s) to ~2 s.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import tensorflow as tf

from . import goodput, input_pipeline
from .model import build_model, compile_model
from .run_dir import write_atomically

TOLERANCE = 0.05
ROUNDS = 3
NEGLIGIBLE: float | None = TOLERANCE
"""A candidate this close to the one before it ends the measurement (`negligible_gain`): what the
choice treats as equal, and then a larger candidate could gain under a third of it."""
FRESH = "auto:fresh"


@dataclass
class Measurement:
    steps_per_execution: int
    steps_per_second: float
    """The median of `rounds`."""
    rounds: list[float] = field(default_factory=list)


def candidates(limit: int) -> list[int]:
    """1, 4, 16, ... below `limit`, and `limit` itself: a factor of 4 between them is fine enough
    to land within a few percent of the best."""
    values, value = [], 1
    while value < limit:
        values.append(value)
        value *= 4
    return values + [limit]


def _rate(train_function, iterator, steps_per_execution: int, min_seconds: float) -> float:
    executions, started = 0, time.perf_counter()
    while True:
        train_function(iterator)["loss"].numpy()
        executions += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return executions * steps_per_execution / elapsed


def measure(model, iterator, steps_per_execution: int, min_seconds: float) -> Measurement:
    """Steps per second of `model`'s train function at `steps_per_execution`, after a warm-up call
    (the first call traces and compiles). For benchmarks of one value; `calibrate` compares many."""
    model.steps_per_execution = steps_per_execution
    train_function = model.make_train_function(force=True)
    train_function(iterator)["loss"].numpy()  # compile and warm up
    rate = _rate(train_function, iterator, steps_per_execution, min_seconds)
    return Measurement(steps_per_execution, rate, [rate])


def choose(measurements: list[Measurement]) -> Measurement:
    """The largest candidate within TOLERANCE of the fastest."""
    best = max(m.steps_per_second for m in measurements)
    return max(
        (m for m in measurements if m.steps_per_second >= (1 - TOLERANCE) * best), key=lambda m: m.steps_per_execution
    )


class Snapshot:
    """The values of a model's and its optimizer's variables, to put back after calibration.

    The optimizer's slots are built first, so that the snapshot covers them: otherwise they would
    be created by the first calibration step and keep its momentum. Call inside the strategy's scope.
    """

    def __init__(self, model):
        model.optimizer.build(model.trainable_variables)
        unique = {id(v): v for v in [*model.variables, *model.optimizer.variables, model.optimizer.iterations]}
        self.variables = list(unique.values())
        self.values = [variable.numpy() for variable in self.variables]

    def restore(self) -> None:
        for variable, value in zip(self.variables, self.values):
            variable.assign(value)


def loop_function(model, iterator):
    """Keras' multi-step train function of `model`, traced and compiled by one call of one step:
    the one compilation that every candidate, and then training, use. `model` must be compiled
    with steps_per_execution > 1 (1 makes Keras build a loop-less function instead)."""
    if int(model.steps_per_execution.numpy()) < 2:
        raise ValueError("calibration needs a model compiled with steps_per_execution > 1")
    train_function = model.make_train_function()
    model.steps_per_execution.assign(1)
    train_function(iterator)["loss"].numpy()
    return train_function


def negligible_gain(before: Measurement, after: Measurement, negligible: float = NEGLIGIBLE) -> bool:
    """Whether `after` (a larger candidate) runs within `negligible` of `before`, either way.

        A step's time at k steps per call is s + c/k (s the step, c the per-call cost). Between j and
        k = 4j the time per step falls by c (1/j - 1/k) = 3c/k, and any larger candidate saves at most
        c/k more: a third of what was just measured. Below `negligible` the rest is within the choice's
    tolerance and this machine's noise. A
        larger candidate clearly slower (beyond `negligible`) is not explained by the per-call cost: the
        full rounds then decide."""
    return abs(after.steps_per_second / before.steps_per_second - 1) < negligible


def calibrate(
    model,
    iterator,
    limit: int,
    min_seconds: float = 0.5,
    max_seconds_per_execution: float | None = None,
    rounds: int = ROUNDS,
    train_function=None,
    negligible: float | None = NEGLIGIBLE,
):
    """Times each candidate on `model`; returns (chosen, all measurements), and leaves the chosen
    value set on the model.

    `train_function` is `loop_function`'s (compiled here when not given). The caller puts the
    model's weights back (`Snapshot`). Each round times every candidate for `min_seconds` (at
    least one execution); the first round also bounds the candidates by `max_seconds_per_execution`,
    and ends at the first candidate within `negligible` of the one before it, which also skips the
    other rounds (None: every candidate, every round).
    """
    train_function = train_function or loop_function(model, iterator)
    tried, timings, cap = [], {}, limit
    for value in candidates(limit):
        if value > cap:
            break
        tried.append(value)
        model.steps_per_execution.assign(value)
        timings[value] = [_rate(train_function, iterator, value, min_seconds)]
        if negligible is not None and len(tried) > 1:
            before, after = (Measurement(v, timings[v][0]) for v in tried[-2:])
            if negligible_gain(before, after, negligible):
                rounds = 1
                break
        if max_seconds_per_execution:
            # Steps that fit in the time bound, at the latest (most amortised) measured rate: a larger
            # candidate runs at least as fast per step, so its execution takes at most this long.
            cap = min(limit, max(1, int(max_seconds_per_execution * timings[value][0])))
    for _ in range(rounds - 1):
        for value in tried:
            model.steps_per_execution.assign(value)
            timings[value].append(_rate(train_function, iterator, value, min_seconds))
    measurements = [Measurement(value, statistics.median(timings[value]), timings[value]) for value in tried]
    chosen = choose(measurements)
    model.steps_per_execution.assign(chosen.steps_per_execution)
    model.reset_metrics()
    return chosen, measurements


# ----------------------------------------------------------------------------- the stored choice


def setting(cfg, target, precision: str) -> dict:
    """Everything that determines the choice: the task's model and data shape, the batch, the
    candidates' bounds, where it runs and the TensorFlow build. Not the run directory, the data's
    location or the seed: a run that differs only in those reuses the measurement."""
    data = {key: value for key, value in asdict(cfg.data).items() if key not in ("dir", "raw")}
    train = cfg.train
    return {
        "task": cfg.task,
        "model": asdict(cfg.model),
        "data": data,
        "global_batch_size": train.global_batch_size,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "optimizer": train.optimizer,
        "limit": limit(train),
        "max_seconds_per_execution": train.max_seconds_per_execution,
        "strategy": target.kind,
        "replicas": target.replicas,
        "hosts": target.hosts,
        "tpu_type": target.tpu_type,
        "precision": precision,
        "tensorflow": tf.__version__,
    }


def limit(train) -> int:
    """The largest candidate: an execution never spans a log, checkpoint or evaluation boundary, nor
    the run (the monitor acts only between executions)."""
    bounds = [train.log_every, train.checkpoint_every, train.total_steps]
    return max(1, min(bounds + ([train.eval_every] if train.eval_every else [])))


def cache_dir(configured: str) -> str:
    """`runtime.cache_dir`, or the user's cache folder ($XDG_CACHE_HOME, else ~/.cache) for this package."""
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, __name__.split(".")[0])


def cache_path(directory: str, key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"{directory.rstrip('/')}/steps_per_execution/{digest}.json"


def record(key: dict, chosen: Measurement, measurements: list[Measurement]) -> dict:
    """What is stored: the setting it holds for, the choice and every measurement."""
    return {
        "setting": key,
        "steps_per_execution": chosen.steps_per_execution,
        "measurements": [asdict(m) for m in measurements],
    }


def read_cache(path: str, key: dict) -> dict | None:
    """The stored record for `key`, or None: absent, or unreadable or for another setting, which one
    line says (the caller then measures again and overwrites the file)."""
    try:
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path) as handle:
            stored = json.load(handle)
    except tf.errors.OpError as error:
        return _ignored(path, f"it cannot be read ({type(error).__name__})")
    except ValueError:  # also bytes that are not UTF-8
        return _ignored(path, "not valid JSON")
    if not isinstance(stored, dict) or not isinstance(stored.get("steps_per_execution"), int):
        return _ignored(path, "not a calibration record")
    if stored.get("setting") != key:
        return _ignored(path, "it holds another setting's calibration")
    return stored


def _ignored(path: str, why: str) -> None:
    print(f"note: ignoring the steps_per_execution cache {path}: {why}; measuring again", flush=True)
    return None


def write_cache(path: str, stored: dict) -> None:
    """Writes the record whole or not at all (`write_atomically`): a write that fails or is killed
    leaves the record before it."""
    tf.io.gfile.makedirs(path.rsplit("/", 1)[0])
    write_atomically(path, json.dumps(stored, indent=2) + "\n")


# ----------------------------------------------------------------------------- a start's decision


@dataclass(frozen=True)
class Decision:
    """What a start compiles with, and where the value it trains with comes from."""

    compiled: int
    """The value the model is compiled with."""
    stored: dict | None = None
    """The calibration record this start reuses."""
    found_in: str = ""
    key: dict | None = None
    """The setting (`setting()`) when `train.steps_per_execution` is auto."""
    measure: bool = False
    """Whether `settle` measures the candidates on the built model before training."""


def decide(cfg, target, own_calibration: dict | None, finished: bool) -> Decision:
    """The one choice of a start, in order: a fixed `train.steps_per_execution`; a run that is only
    evaluated (`finished`: it finished or stopped early; 1, nothing measured); a calibration stored
    for this setting (the run's own metrics.json, then the cache); else measured on the built model,
    which is compiled with Keras' loop over the steps_per_execution variable so that one compilation
    serves every candidate."""
    value = cfg.train.steps_per_execution
    if value not in ("auto", FRESH):
        return Decision(int(value))
    if finished:
        return Decision(1)
    key = setting(cfg, target, cfg.runtime.mixed_precision)
    stored, found_in = stored_calibration(cfg, key, own_calibration)
    if stored:
        return Decision(stored["steps_per_execution"], stored, found_in, key)
    return Decision(max(2, limit(cfg.train)), key=key, measure=True)


def stored_calibration(cfg, key: dict, own: dict | None) -> tuple[dict | None, str]:
    """(the stored choice for this setting, where it was found): the run's own metrics.json first
    (a resume), then the cache (a rerun, or a new run with the same setting)."""
    if cfg.train.steps_per_execution == FRESH:
        return None, ""
    if isinstance(own, dict) and own.get("setting") == key:
        return own, "this run's metrics.json"
    path = cache_path(cache_dir(cfg.runtime.cache_dir), key)
    cached = read_cache(path, key)
    return cached, (f"the cache {path}" if cached else "")


@dataclass(frozen=True)
class Settled:
    """What `settle` made of a decision: the value this start trains with, and the calibration record
    for the run's metrics.json (None when the value was given)."""

    steps_per_execution: int
    calibration: dict | None = None


def settle(decision: Decision, cfg, model, dataset, strategy, clock: goodput.PhaseClock) -> Settled:
    """The value this start trains with, set on `model`: `decide`'s, after measuring the candidates on
    the model to be trained when it says so (its restored or initial state is put back afterwards).
    Compiling the loop is booked as the first execution: training reuses it, and a start that reuses
    a stored choice pays it in fit() instead. The config is not changed: the caller makes a new one."""
    if decision.key is None:  # fixed, or a finished run
        return Settled(decision.compiled)
    stored = decision.stored
    if decision.measure:
        with strategy.scope():
            snapshot = Snapshot(model)
            with clock.phase(goodput.FIRST_EXECUTION):
                iterator = iter(dataset)
                train_function = loop_function(model, iterator)
            with clock.phase(goodput.CALIBRATION):
                chosen, measurements = calibrate_and_report(cfg, model, iterator, train_function)
                snapshot.restore()
                del iterator
        stored = record(decision.key, chosen, measurements)
        cache = cache_path(cache_dir(cfg.runtime.cache_dir), decision.key)
        write_cache(cache, stored)
        print(f"  stored in this run's metrics.json and in {cache}", flush=True)
    else:
        print(
            f"steps_per_execution {stored['steps_per_execution']}: reusing the calibration in "
            f"{decision.found_in} (no candidate compiled; train.steps_per_execution={FRESH} measures again)",
            flush=True,
        )
    model.steps_per_execution.assign(stored["steps_per_execution"])
    return Settled(stored["steps_per_execution"], stored)


def choose_for(cfg, task, target, manifest: dict) -> tuple[int, list[Measurement]]:
    """(`train.steps_per_execution`, the measurements) for the benchmarks and tests: measured on a
    model of its own when it is `auto` (a run calibrates the model it trains, in `settle`)."""
    if cfg.train.steps_per_execution not in ("auto", FRESH):
        return int(cfg.train.steps_per_execution), []
    with target.strategy.scope():
        model = compile_model(build_model(cfg, task, manifest), cfg, task, manifest, max(2, limit(cfg.train)))
    dataset = input_pipeline.training_dataset(cfg, task, target, manifest, seed=cfg.runtime.seed)
    chosen, measurements = calibrate_and_report(cfg, model, iter(dataset))
    return chosen.steps_per_execution, measurements


def calibrate_and_report(cfg, model, iterator, train_function=None):
    """`calibrate` with the config's bounds, printing why it chose what it chose; returns (chosen,
    measurements)."""
    bound = limit(cfg.train)
    print(
        f"calibrating steps_per_execution (candidates up to {bound}, median of {ROUNDS} rounds each, "
        "one round where the per-call cost is negligible):",
        flush=True,
    )
    chosen, measurements = calibrate(
        model,
        iterator,
        bound,
        max_seconds_per_execution=cfg.train.max_seconds_per_execution,
        train_function=train_function,
        negligible=NEGLIGIBLE,
    )
    best = max(m.steps_per_second for m in measurements)
    for m in measurements:
        mark = "  <- chosen" if m is chosen else ""
        rounds = ", ".join(f"{rate:.2f}" for rate in m.rounds)
        print(
            f"  steps_per_execution {m.steps_per_execution:4d}: {m.steps_per_second:8.2f} steps/s "
            f"(rounds {rounds}){mark}",
            flush=True,
        )
    print(
        f"  chose {chosen.steps_per_execution}: the largest within {TOLERANCE:.0%} of the fastest ({best:.2f} steps/s)",
        flush=True,
    )
    skipped = [value for value in candidates(bound) if value > measurements[-1].steps_per_execution]
    stopped = len(measurements) > 1 and len(measurements[-1].rounds) < ROUNDS
    if stopped and NEGLIGIBLE is not None:
        before, after = measurements[-2:]
        print(
            f"  stopped after one round: {after.steps_per_execution} runs within {NEGLIGIBLE:.1%} of "
            f"{before.steps_per_execution} ({after.steps_per_second / before.steps_per_second - 1:+.1%}), so the "
            "per-call cost is negligible next to a step"
            + (f" and {', '.join(map(str, skipped))} cannot be measurably faster" if skipped else ""),
            flush=True,
        )
    elif skipped:
        print(
            f"  not tried: {', '.join(map(str, skipped))} (one execution would exceed "
            f"train.max_seconds_per_execution={cfg.train.max_seconds_per_execution:g} s)",
            flush=True,
        )
    return chosen, measurements
