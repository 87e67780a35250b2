"""Starting a new run from another run's weights (`train.init_from`), and training part of a model
(`train.freeze`).

A run's first start reads the weights of another run's checkpoint (or export) into its model before step 0;
every later start resumes its own checkpoint and never reads the other run again. Weights are
matched by their path in the model (`block0_mlp_in/kernel`: the layer names a task gives its layers),
so a model of another task whose layers share names and shapes loads them: a fine-tuned model's
blocks from a pretrained one's, say. What the source does not hold stays as initialised (new);
what `train.init_skip` names stays as initialised whatever the source holds (a classification head
for another number of classes). A weight of another shape not named there is one line naming it.

`train.freeze` names layers whose weights do not train: they get no gradient and no optimizer slot,
and batch normalisation inside them normalises by its moving statistics (Keras' rule for a layer
that is not trainable). The memory plan and the parameter counts build the model through
`build_model`, so they leave the frozen weights' gradients and slots out too.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math

import tensorflow as tf

from .errors import UserError
from .run_dir import run_path

GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
STEP_KEY = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"


def weight_path(variable) -> str:
    """A weight's path in its model: its name without the `:0` (`block0_mlp_in/kernel`)."""
    return variable.name.rsplit(":", 1)[0]


def matches(path: str, patterns) -> str | None:
    """The first of `patterns` (shell-style: `logits`, `block*`, `*/bias`) that names `path` or a
    layer it is in; None when none does."""
    for pattern in patterns:
        if fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, f"{pattern}/*"):
            return pattern
    return None


# ----------------------------------------------------------------------------------- the source


EXPORTED = "/variables/variables"
"""Where a SavedModel keeps its weights: a checkpoint whose root is the model itself."""


def checkpoint_of(init_from: str) -> str:
    """The checkpoint `train.init_from` names: a checkpoint path (`.../ckpt-600`), a folder of
    checkpoints (`runs/x/checkpoints/best`: its newest), a run directory (its newest checkpoint) or a
    run's export (the SavedModel's weights)."""
    if tf.io.gfile.exists(f"{init_from}.index"):
        return init_from
    if tf.io.gfile.exists(run_path(init_from, "saved_model.pb")):
        return f"{init_from.rstrip('/')}{EXPORTED}"
    for folder in (init_from, run_path(init_from, "checkpoints")):
        found = tf.train.latest_checkpoint(folder) if tf.io.gfile.isdir(folder) else None
        if found:
            return found
    raise UserError(
        f"train.init_from={init_from} holds no checkpoint; give a run directory, its checkpoints/best "
        "folder, a checkpoint path such as runs/pretrain/checkpoints/ckpt-600, or a run's export"
    )


@dataclasses.dataclass(frozen=True)
class Source:
    """The weights of a checkpoint's model, by path, and the step it was saved at."""

    checkpoint: str
    keys: dict
    """path -> the key of its value in the checkpoint."""
    shapes: dict
    """path -> shape."""
    step: int | None

    @classmethod
    def read(cls, init_from: str) -> "Source":
        from tensorflow.core.protobuf import trackable_object_graph_pb2

        checkpoint = checkpoint_of(init_from)
        reader = tf.train.load_checkpoint(checkpoint)
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor(GRAPH))
        stored = reader.get_variable_to_shape_map()
        # A run's checkpoint holds the model under `model/`; an export's root is the model, saved with
        # its optimizer (`optimizer/`) and its metrics' state (`keras_api/`), which are not weights.
        exported = checkpoint.endswith(EXPORTED)
        keys = {
            attribute.full_name: attribute.checkpoint_key
            for node in graph.nodes
            for attribute in node.attributes
            if attribute.checkpoint_key in stored
            and (
                not attribute.checkpoint_key.startswith(("optimizer/", "keras_api/"))
                if exported
                else attribute.checkpoint_key.startswith("model/")
            )
        }
        if not keys:
            raise UserError(
                f"train.init_from: {checkpoint} holds no model weights (not a checkpoint of a run of this "
                "project); give a run directory or one of its checkpoints"
            )
        step = int(reader.get_tensor(STEP_KEY)) if STEP_KEY in stored else None
        return cls(checkpoint, keys, {path: tuple(stored[key]) for path, key in keys.items()}, step)


# ------------------------------------------------------------------------------------ the match


@dataclasses.dataclass(frozen=True)
class Match:
    """What a model takes from a source: each weight loaded, new (not in the source) or skipped."""

    loaded: list
    """[(path, shape)] read from the source."""
    new: list
    """[(path, shape)] the source does not hold: as initialised."""
    skipped: list
    """[(path, shape, source shape)] named by train.init_skip: as initialised."""
    unused: list
    """Paths the source holds that this model has not."""
    vocabulary: str = ""
    """What was checked of the source's tokenizer (`check_vocabulary`), where the data has one."""

    def summary(self, source: Source, init_from: str) -> dict:
        """What metrics.json records (`initialised_from`)."""
        return {
            "init_from": init_from,
            "checkpoint": source.checkpoint,
            "step": source.step,
            "loaded": len(self.loaded),
            "loaded_parameters": sum(math.prod(shape) for _, shape in self.loaded),
            "new": [f"{path} {list(shape)}" for path, shape in self.new],
            "skipped": [f"{path} {list(shape)} (source {list(theirs)})" for path, shape, theirs in self.skipped],
            "unused": len(self.unused),
        }

    def describe(self, source: Source) -> str:
        step = f" at step {source.step}" if source.step is not None else ""
        lines = [
            f"initialised from {source.checkpoint}{step}: {len(self.loaded)} weights loaded "
            f"({sum(math.prod(shape) for _, shape in self.loaded):,} parameters), {len(self.new)} new, "
            f"{len(self.skipped)} skipped by train.init_skip, {len(self.unused)} of the source's not in this model"
        ]
        lines += [f"  {self.vocabulary}"] if self.vocabulary else []
        lines += [f"  new: {path} {list(shape)}" for path, shape in self.new]
        lines += [f"  skipped: {path} {list(shape)} (source {list(theirs)})" for path, shape, theirs in self.skipped]
        return "\n".join(lines)


def match(model, source: Source, init_skip) -> Match:
    """Which of `model`'s weights `source` gives; a weight of another shape that `init_skip` does not
    name is a one-line UserError, and so is a pattern of `init_skip` that names no weight."""
    loaded, new, skipped, used = [], [], [], set()
    for variable in model.weights:
        path, shape = weight_path(variable), tuple(variable.shape)
        theirs = source.shapes.get(path)
        if matches(path, init_skip):
            skipped.append((path, shape, theirs))
        elif theirs is None:
            new.append((path, shape))
        elif theirs != shape:
            layer = path.split("/")[0]
            raise UserError(
                f"train.init_from: {path} is {list(theirs)} in {source.checkpoint} but {list(shape)} in this "
                f"config's model; make the model keys match the source run's, or leave it as initialised "
                f"with train.init_skip=[{layer}]"
            )
        else:
            loaded.append((path, shape))
        used.add(path)
    for pattern in init_skip:
        if not any(matches(path, [pattern]) for path in used):
            raise UserError(
                f"train.init_skip: {pattern!r} names no weight of this model; its layers with weights are "
                f"{', '.join(sorted({path.split('/')[0] for path in used}))}"
            )
    return Match(loaded, new, skipped, sorted(set(source.keys) - used))


def run_of(checkpoint: str) -> str | None:
    """The run directory a checkpoint is in (`runs/x` of runs/x/checkpoints/best/ckpt-600), or None."""
    folder = f"/{checkpoint.rsplit('/', 1)[0]}"
    return folder.rsplit("/checkpoints", 1)[0][1:] or "." if "/checkpoints" in folder else None


def export_of(checkpoint: str) -> str | None:
    """The export a source's weights belong to: the SavedModel they are in, else the export of the
    run directory of a checkpoint; None for a checkpoint outside a run directory."""
    if checkpoint.endswith(EXPORTED):
        return checkpoint[: -len(EXPORTED)]
    run = run_of(checkpoint)
    return run_path(run, "export") if run else None


def source_manifest(checkpoint: str) -> dict | None:
    """The data manifest of the run that wrote `checkpoint`, as its export keeps it; None when the
    run has no export (it never finished) or the checkpoint is not in a run directory."""
    export = export_of(checkpoint)
    path = run_path(export, "assets.extra", "manifest.json") if export else None
    if not path or not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as handle:
        return json.load(handle)


def check_vocabulary(source: Source, manifest: dict) -> str:
    """Refuses, in one line, a source whose tokenizer is not the data's (the same ids would mean other
    pieces); returns what was checked, for the start's log."""
    theirs = (source_manifest(source.checkpoint) or {}).get("tokenizer")
    ours = manifest.get("tokenizer")
    if not ours:
        return ""
    if not theirs:
        return "the source run's tokenizer not checked (it has no export)"
    if theirs.get("sha256") != ours.get("sha256"):
        raise UserError(
            f"train.init_from: the source run's tokenizer (sha256 {str(theirs.get('sha256'))[:12]}) is not this "
            f"data's ({str(ours.get('sha256'))[:12]}), so the same ids mean other pieces; preprocess with "
            f"data.tokenizer={run_of(source.checkpoint) or export_of(source.checkpoint)} to share it"
        )
    return f"the same tokenizer as the source run (sha256 {str(ours['sha256'])[:12]})"


def load(model, init_from: str, init_skip, manifest: dict | None = None) -> tuple[Source, Match]:
    """Reads `init_from`'s weights into `model` (built, under its strategy's scope) after checking
    that the source's tokenizer, where the data has one, is the data's (`manifest`); returns what it
    read and what it matched."""
    source = Source.read(init_from)
    vocabulary = check_vocabulary(source, manifest or {})
    found = dataclasses.replace(match(model, source, init_skip), vocabulary=vocabulary)
    reader = tf.train.load_checkpoint(source.checkpoint)
    by_path = {weight_path(variable): variable for variable in model.weights}
    for path, _ in found.loaded:
        variable = by_path[path]
        variable.assign(tf.cast(reader.get_tensor(source.keys[path]), variable.dtype))
    return source, found


# ------------------------------------------------------------------------------------- freezing


def freeze(model, patterns) -> list[str]:
    """Makes the layers `patterns` name (by layer name, nested layers included) not trainable;
    returns their names. A pattern that names no layer with weights is a one-line UserError."""
    if not patterns:
        return []
    layers = [layer for layer in model._flatten_layers(include_self=False) if layer.weights]
    frozen = []
    for pattern in patterns:
        named = [layer for layer in layers if fnmatch.fnmatchcase(layer.name, pattern)]
        if not named:
            raise UserError(
                f"train.freeze: {pattern!r} names no layer with weights in this model; its layers are "
                f"{', '.join(layer.name for layer in layers)}"
            )
        for layer in named:
            layer.trainable = False
            frozen.append(layer.name)
    return sorted(set(frozen))


def parameters_line(model, frozen: list[str]) -> str:
    """How many parameters train, and what is frozen."""
    trainable = sum(math.prod(variable.shape) for variable in model.trainable_weights)
    total = sum(math.prod(variable.shape) for variable in model.weights)
    line = f"{trainable:,} of {total:,} parameters train"
    return line + (f" (train.freeze: {', '.join(frozen)})" if frozen else "")
