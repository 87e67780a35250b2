"""The memory levers: config keys that shrink what a training step holds on a chip, in the order
worth trying. `make doctor` plans each one (and applies them in this order until a plan fits); an
out-of-memory error names the ones the run does not use yet (`out_of_memory`, below). One table for both, so
the advice a failed run gives is the advice the plan gives.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import tensorflow as tf

from . import memory
from . import topology as topology_lib
from .errors import UserError
from .topology import Target


@dataclass(frozen=True)
class Lever:
    setting: str
    """The config override that pulls it, e.g. 'model.remat=true'."""
    effect: str
    """What it saves, and what it costs."""
    change: dict = field(default_factory=dict)
    """The same change for the memory plan (`make doctor`): `remat`, `optimizer` or `precision_name`."""
    unused: Callable[[Any, str], bool] = lambda cfg, precision: True
    """(config, the precision the run uses: 'bfloat16' or 'float32') -> whether the lever is still free."""

    def describe(self) -> str:
        return f"{self.setting} ({self.effect})"


LEVERS = (
    Lever(
        "model.remat=true",
        "recomputes each block in the backward pass and keeps only its input",
        {"remat": True},
        lambda cfg, precision: getattr(cfg.model, "remat", None) is False,
    ),
    Lever(
        "train.optimizer=adafactor",
        "a factored second moment in place of two full-size optimizer slots",
        {"optimizer": "adafactor"},
        lambda cfg, precision: cfg.train.optimizer != "adafactor",
    ),
    Lever(
        "runtime.mixed_precision=bfloat16",
        "halves the activations",
        {"precision_name": "bfloat16"},
        lambda cfg, precision: precision == "float32",
    ),
)

ACCUMULATION = Lever(
    "a smaller train.global_batch_size with a larger train.gradient_accumulation_steps",
    "the same effective batch, a fraction of the activations, one more copy of the gradients",
)
"""Always free, and the last to pull: its setting depends on the factor (`accumulation`)."""


def unused(cfg, precision: str) -> list[Lever]:
    """The levers of LEVERS the config does not pull yet, in order (ACCUMULATION not included)."""
    return [lever for lever in LEVERS if lever.unused(cfg, precision)]


def accumulation(cfg, factor: int) -> str:
    """ACCUMULATION's setting for `factor` times fewer examples per step: the same effective batch."""
    train = cfg.train
    return (
        f"train.global_batch_size={train.global_batch_size // factor} "
        f"train.gradient_accumulation_steps={train.gradient_accumulation_steps * factor}"
    )


def describe(cfg, precision: str) -> str:
    """Every lever still free, with what it does: the end of an out-of-memory line."""
    return ", ".join(lever.describe() for lever in [*unused(cfg, precision), ACCUMULATION])


# ------------------------------------------------------------------ out of device memory


def out_of_memory(cfg, task, manifest: dict, target: Target, error: Exception) -> str:
    """One line for a step that ran out of device memory: the estimate of what it needs (the model
    planned from its shapes, core/memory.py), the device's memory and the levers."""
    first = first_line(error)
    per_replica = target.per_replica_batch_size(cfg.train.global_batch_size)
    hbm = replica_hbm_bytes(target)
    try:
        plan = memory.estimate_for(cfg, task, manifest, per_replica, hbm)
        estimate = f"the step needs about {memory.gib(plan.total)} per replica ({plan.breakdown()})"
        if hbm:
            estimate += f" of {memory.gib(hbm)} HBM"
    except Exception as failure:  # noqa: BLE001 - the estimate is a help; the error is the news
        estimate = f"no estimate ({type(failure).__name__})"
    return (
        f"out of device memory at {per_replica} examples per replica ({first}); {estimate}; "
        f"`make doctor` shows the plan and what each lever saves: {describe(cfg, cfg.runtime.mixed_precision)}"
    )


# What TensorFlow's error says around its news: a graph's traceback ('Graph execution error:',
# 'Detected at node ...', its frames), the count of replicas that failed ('8 root error(s) found.'),
# and before each replica's error its number and status ('  (0) RESOURCE_EXHAUSTED: ').
_AROUND = re.compile(r"^(Graph execution error|Detected at node|File |\d+ root error\(s\) found)")
_REPLICA = re.compile(r"^\(\d+\)\s*(RESOURCE_EXHAUSTED:)?\s*")


def first_line(error: Exception) -> str:
    """The line of TensorFlow's error that says what ran out, at most 160 characters: its first that
    is not around the news (`_AROUND`), without a replica's number (`_REPLICA`)."""
    lines = [_REPLICA.sub("", line.strip()) for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines if line and not _AROUND.match(line)]
    return (said or lines or [type(error).__name__])[0][:160]


def replica_hbm_bytes(target: Target) -> int:
    """One replica's share of a TPU chip's HBM (a TensorCore's on v2/v3); 0 off a known TPU."""
    return topology_lib.chip(target.tpu_type).replica_hbm_bytes if target.kind == "tpu" and target.tpu_type else 0


@contextlib.contextmanager
def out_of_memory_reported(cfg, task, manifest: dict, target: Target):
    """Running out of device memory inside the block raises a UserError with `out_of_memory`'s one
    line instead of TensorFlow's traceback. `cfg.runtime.mixed_precision` is the precision that runs
    (the levers depend on it)."""
    try:
        yield
    except tf.errors.ResourceExhaustedError as error:
        raise UserError(out_of_memory(cfg, task, manifest, target, error)) from None
