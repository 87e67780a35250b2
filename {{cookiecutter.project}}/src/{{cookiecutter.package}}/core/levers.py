"""The memory levers: config keys that shrink what a training step holds on a chip, in the order
worth trying. `make doctor` plans each one (and applies them in this order until a plan fits); an
out-of-memory error names the ones the run does not use yet (trainer.py). One table for both, so
the advice a failed run gives is the advice the plan gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


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
