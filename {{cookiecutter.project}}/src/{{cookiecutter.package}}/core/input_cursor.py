"""The train input's position, saved in every checkpoint, so that a resumed run reads on from where
the run stopped, exactly what an uninterrupted run would read.

The iterator of a distributed dataset cannot be checkpointed in TensorFlow 2.20 (its per-device
iterators keep no state to save), so the position is rebuilt, not restored: the train order is a
function of (seed, position) alone (input_pipeline.train_records), and every pipeline's position is
the steps trained since the order began times the records a step takes from it. The cursor holds
what that arithmetic needs (the order's seed and first step) and what it assumes (the train files
and their counts, the number of input pipelines and replicas, the batch, the accumulation and the
shuffle window).

A resume on another number of replicas or input pipelines (hosts) with the same global batch
continues the epoch: a step takes the same records from each pipeline whatever the replicas, and
when the pipelines change, what the old pipelines had not read of their epoch is split over the new
ones in consecutive pieces (`redistribute`), each record read once; the next epoch is the new
layout's own order from (seed, epoch). A resume whose data, global batch, accumulation or shuffle
window differ is refused in one line, or, with `runtime.resume_input=reseed`, continues in a new
order seeded by the step.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import tensorflow as tf

from .config import Config
from .errors import UserError
from .input_pipeline import Piece, Share

VERSION = 2
ELASTIC = ("input_pipelines", "replicas")
"""Layout keys a resume may change: the epoch goes on over the new pipelines (`redistribute`)."""


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
    """The train order this start reads: its seed, the step it began at, and a line on why. After a
    resume on another number of pipelines, each pipeline first reads its `pending` pieces (the old
    layout's unread records of its epoch) and then its own order from the start of `first_epoch`."""

    seed: int
    from_step: int
    note: str = ""
    first_epoch: int = 0
    pending: tuple[tuple[Piece, ...], ...] = ()

    def saved(self) -> dict:
        return {
            "order_seed": self.seed,
            "order_from_step": self.from_step,
            "order_first_epoch": self.first_epoch,
            "order_pending": [[dataclasses.astuple(piece) for piece in pieces] for pieces in self.pending],
        }

    @staticmethod
    def of(saved: dict) -> "Order":
        return Order(
            int(saved["order_seed"]),
            int(saved["order_from_step"]),
            first_epoch=int(saved.get("order_first_epoch", 0)),
            pending=tuple(tuple(Piece(*piece) for piece in pieces) for pieces in saved.get("order_pending", [])),
        )


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
                **self.order.saved(),
                "step": int(self.step()),
            },
            sort_keys=True,
        )

    def deserialize(self, string_value) -> None:
        value = string_value.numpy() if hasattr(string_value, "numpy") else string_value
        self.restored = json.loads(value.decode() if isinstance(value, bytes) else value)

    def _copy_trackable_to_cpu(self, object_map):
        """An asynchronous checkpoint's copy (train.async_checkpoint): the JSON of the moment the save
        was called, which the background thread then writes while training goes on. TensorFlow calls
        this inside a tf.function after the first save, so a py_function takes the JSON when it runs."""
        copy = object_map.setdefault(self, _Copied())
        tf.py_function(lambda: setattr(copy, "value", self.serialize()), [], [])

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
        elastic = changed and all(key in ELASTIC for key in _changed_keys(self.restored, self.layout))
        if elastic:
            self.order = redistribute(self.restored, self.layout, initial_step)
            return self.order
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
        self.order = Order.of(self.restored)
        return self.order

    def reseeded(self, initial_step: int, note: str) -> Order:
        """A new order from `initial_step`, seeded by it (so it does not replay the run's first batches)."""
        self.order = Order(self.layout["seed"] + initial_step, initial_step, note)
        return self.order


class _Copied(tf.train.experimental.PythonState):
    """The cursor's JSON as an asynchronous save copied it; only ever written."""

    value = ""

    def serialize(self) -> str:
        return self.value

    def deserialize(self, string_value) -> None:
        raise NotImplementedError("a copy for writing only")


def _changed_keys(restored: dict, layout: dict) -> list[str]:
    return [key for key, value in layout.items() if restored.get(key) != value]


def records_per_step(layout: dict) -> int:
    """Records one step takes from each input pipeline: the same whatever the replicas."""
    return layout["global_batch_size"] * layout["gradient_accumulation_steps"] // layout["input_pipelines"]


def redistribute(saved: dict, layout: dict, step: int) -> Order:
    """The order of a resume at `step` on `layout` from a checkpoint's cursor `saved` (another number
    of replicas or input pipelines, the same data and global batch).

    The same pipelines: each step takes the same records from each of them whatever the replicas,
    so the order goes on. Other pipelines: the job's epoch is the furthest old pipeline's (pipelines
    with unequal shares of the files drift apart: the one with fewer records starts its next epoch
    sooner). Each old pipeline's unread records up to the end of that epoch (its pending pieces, the
    rest of its own epoch, and any whole epoch of its own it had not begun) are concatenated in
    pipeline order and cut into as many consecutive runs as there are new pipelines (sizes differing
    by at most one), each read once; every new pipeline then reads its own order from the start of
    the next epoch. So every record is read once per epoch of the job, whatever the layouts.
    """
    old, files, counts = Order.of(saved), layout["train_files"], layout["examples_per_file"]
    where = (
        f"resumed on {layout['input_pipelines']} host{'s' if layout['input_pipelines'] != 1 else ''} x "
        f"{layout['replicas']} replicas from a {saved['input_pipelines']} x {saved['replicas']} layout at step {step}"
    )
    if saved["input_pipelines"] == layout["input_pipelines"]:
        return dataclasses.replace(
            old, note=f"{where}: the same records per step from each pipeline, the order goes on"
        )
    consumed = (step - old.from_step) * records_per_step(saved)
    # Where each old pipeline is: the rest of its pending pieces (still in the epoch before the
    # order's first), then its own order from `position`, in `epoch`.
    where_each = []
    for pipeline in range(saved["input_pipelines"]):
        pieces = old.pending[pipeline] if old.pending else ()
        in_pending = sum(piece.count for piece in pieces)
        share = Share.of(files, counts, pipeline, saved["input_pipelines"])
        if consumed < in_pending:
            rest, left = [], consumed
            for piece in pieces:
                if left < piece.count:
                    rest.append(dataclasses.replace(piece, start=piece.start + left, count=piece.count - left))
                left = max(0, left - piece.count)
            where_each.append((share, rest, share.epoch_start(old.first_epoch), old.first_epoch - 1))
        else:
            position = share.epoch_start(old.first_epoch) + consumed - in_pending
            where_each.append((share, [], position, share.epoch_of(position)))
    # The job's epoch is the furthest pipeline's: hosts with unequal shares drift apart, and each old
    # pipeline's records up to the end of that epoch are read once before the new layout's next one.
    epoch = max(its_epoch for *_, its_epoch in where_each)
    unread: list[Piece] = []
    for pipeline, (share, rest, position, _) in enumerate(where_each):
        unread += rest
        end = share.epoch_start(epoch + 1)
        if end > position:
            unread.append(Piece(old.seed, saved["input_pipelines"], pipeline, position, end - position))
    left_over = sum(piece.count for piece in unread)
    pending = tuple(
        _cut(unread, left_over * new // layout["input_pipelines"], left_over * (new + 1) // layout["input_pipelines"])
        for new in range(layout["input_pipelines"])
    )
    behind = min(its_epoch for *_, its_epoch in where_each)
    drift = f" (the hosts were in epochs {behind} to {epoch}: each reads to its end)" if behind < epoch else ""
    return Order(
        old.seed,
        step,
        f"{where}: {left_over:,} records left to the end of epoch {epoch}{drift}, redistributed",
        first_epoch=epoch + 1,
        pending=pending,
    )


def _cut(pieces: list[Piece], begin: int, end: int) -> tuple[Piece, ...]:
    """The records [begin, end) of the concatenated `pieces`, as pieces."""
    cut, offset = [], 0
    for piece in pieces:
        low, high = max(begin, offset), min(end, offset + piece.count)
        if low < high:
            cut.append(dataclasses.replace(piece, start=piece.start + low - offset, count=high - low))
        offset += piece.count
    return tuple(cut)


def saved_in(path: str) -> bool:
    """Whether the checkpoint at `path` holds an input cursor (one written before cursors has none)."""
    return any(name.startswith("input/") for name, _ in tf.train.list_variables(path))


def _short(value) -> str:
    """A layout value in a one-line message: lists by their length and ends."""
    if isinstance(value, list) and len(value) > 3:
        return f"[{value[0]}, ... {value[-1]}] ({len(value)})"
    return str(value)
