"""The train input's position, saved in every checkpoint, so that a resumed run reads on from where
the run stopped, exactly what an uninterrupted run would read.

The iterator of a distributed dataset cannot be checkpointed in TensorFlow 2.20 (its per-device
iterators keep no state to save), so the position is rebuilt, not restored: the train order is a
function of (seed, position) alone (input_pipeline.train_records), and every pipeline's position is
the steps trained since the order began times the records a step takes from it. The cursor holds
what that arithmetic needs (the order's seed and first step) and what it assumes (the train files
and their counts, the number of input pipelines and replicas, the batch, the accumulation and the
shuffle window): a resume whose data or layout differs is refused in one line, or, with
`runtime.resume_input=reseed`, continues in a new order seeded by the step.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import tensorflow as tf

from .config import Config
from .errors import UserError

VERSION = 1


def layout(cfg: Config, manifest: dict, input_pipelines: int, replicas: int) -> dict:
    """What a position means: a resume with another layout cannot continue the same order."""
    train = manifest["splits"]["train"]
    return {
        "seed": cfg.runtime.seed,
        "train_files": list(train["files"]),
        "examples_per_file": list(train["examples_per_file"]),
        "input_pipelines": input_pipelines,
        "replicas": replicas,
        "global_batch_size": cfg.train.global_batch_size,
        "gradient_accumulation_steps": cfg.train.gradient_accumulation_steps,
        "shuffle_window": cfg.data.shuffle_buffer,
    }


@dataclasses.dataclass
class Order:
    """The train order this start reads: its seed, the step it began at, and a line on why."""

    seed: int
    from_step: int
    note: str = ""


class InputCursor(tf.train.experimental.PythonState):
    """Saved with the model and optimizer in every checkpoint (as `input`): the layout, the order
    and the step, as JSON. A checkpoint written before cursors existed has none: `restored` stays
    None after its restore."""

    def __init__(self, layout: dict, step: Callable[[], int]):
        self.layout, self.step = layout, step
        self.order = Order(layout["seed"], 0)
        self.restored: dict | None = None

    def serialize(self) -> str:
        return json.dumps(
            {
                "version": VERSION,
                **self.layout,
                "order_seed": self.order.seed,
                "order_from_step": self.order.from_step,
                "step": int(self.step()),
            },
            sort_keys=True,
        )

    def deserialize(self, string_value) -> None:
        value = string_value.numpy() if hasattr(string_value, "numpy") else string_value
        self.restored = json.loads(value.decode() if isinstance(value, bytes) else value)

    def resume(self, initial_step: int, reseed: bool) -> Order:
        """The order this start continues (and the cursor saves from now on): the restored one when
        its layout is this run's, else one line: refused, or (`reseed`) a new order from this step."""
        if initial_step == 0:
            self.order = Order(self.layout["seed"], 0)
            return self.order
        if self.restored is None:
            return self.reseeded(
                initial_step,
                f"the checkpoint at step {initial_step} holds no input position (written before positions were "
                "saved): the input continues in a new order seeded by the step",
            )
        changed = [
            f"{key} {_short(self.restored.get(key))} -> {_short(value)}"
            for key, value in self.layout.items()
            if self.restored.get(key) != value
        ]
        if changed:
            what = "; ".join(changed)
            if not reseed:
                raise UserError(
                    f"the checkpoint at step {initial_step} was trained on another input ({what}): it cannot "
                    "continue the same order; restore those settings, or add runtime.resume_input=reseed to "
                    "continue in a new order seeded by the step"
                )
            return self.reseeded(
                initial_step,
                f"the input changed since step {initial_step} ({what}): continuing in a new order seeded by the "
                "step (runtime.resume_input=reseed)",
            )
        self.order = Order(int(self.restored["order_seed"]), int(self.restored["order_from_step"]))
        return self.order

    def reseeded(self, initial_step: int, note: str) -> Order:
        """A new order from `initial_step`, seeded by it (so it does not replay the run's first batches)."""
        self.order = Order(self.layout["seed"] + initial_step, initial_step, note)
        return self.order


def saved_in(path: str) -> bool:
    """Whether the checkpoint at `path` holds an input cursor (one written before cursors has none)."""
    return any(name.startswith("input/") for name, _ in tf.train.list_variables(path))


def _short(value) -> str:
    """A layout value in a one-line message: lists by their length and ends."""
    if isinstance(value, list) and len(value) > 3:
        return f"[{value[0]}, ... {value[-1]}] ({len(value)})"
    return str(value)
