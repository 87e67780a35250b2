"""What a training step holds in a chip's memory, and what it computes, read from the traced step.

`trace(model, batch, objective)` traces one training step (forward pass, the task's loss,
gradients) of any Keras model into a graph without running it, and reads from that graph:
- the activations kept for the backward pass: every tensor computed from the input (or the
  targets) that an op of the backward pass reads, in the dtype it has (bfloat16 under mixed
  precision), counted once. The loss is the task's own (its `loss`, or its `step_loss`), so the
  float32 logits that a softmax cross-entropy keeps are counted; a dropout mask is counted at one
  byte per element (XLA keeps it as a predicate), whatever dtype the unfused graph casts it to;
  with recomputation (`model.remat`) these are the blocks' inputs, plus the largest block's
  recomputed activations, which live during that block's backward pass;
- the weight copies the backward pass reads (the bfloat16 casts of float32 variables);
- the model's FLOPs: 2 x M x N x K for every matrix multiply, einsum and convolution of the
  forward pass, times 3 for a training step (the backward pass multiplies twice: once for the
  input's gradient, once for the weight's). Recomputation adds hardware FLOPs, not model FLOPs.

The graph is the host's unfused one: every elementwise intermediate that the backward pass reads
is counted (a LayerNorm's float32 copies, GELU's intermediates), where XLA on a TPU fuses some of
them away. The plan counts them (it errs on the side of "does not fit"); the README compares it
with the independent count of Korthikanti et al. (2022) for the decoder.

Models for the plan are built inside `abstract()`, whose variables are handles that are never
given a value, so that any size plans in seconds from shapes alone; `Planner` and
`estimate_for(cfg, task, manifest, ...)` build, trace and plan that way.

`plan(...)` adds the float32 weights, their gradients, the accumulator of gradient accumulation
and the optimizer's slots (by optimizer: SGD's momentum, AdamW's two moments, Adafactor's factored
second moment), and compares the total with a chip's HBM less a share for XLA's own buffers. It
is an estimate: XLA fuses elementwise ops (keeping less) and allocates temporaries (more); `make
bench-memory` measures it against the process's memory on this machine, and the README gives the
factor seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from . import precision as precision_lib

GIB = 2**30
# Share of a chip's HBM kept for XLA's own buffers (the program, infeed, temporaries of fusions);
# what the estimate may use is the rest.
XLA_RESERVE = 0.15
# Above this share of what it may use, a plan is a WARN: the estimate is not exact.
WARN_SHARE = 0.8

_ALIASES = {"Identity", "Reshape", "ExpandDims", "Squeeze", "StopGradient", "IdentityN", "EnsureShape"}
_MULTIPLIES = {
    "MatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Einsum",
    "Conv2D",
    "Conv3D",
    "DepthwiseConv2dNative",
}


@dataclass(frozen=True)
class Trace:
    batch: int
    """Examples per replica the step was traced with."""
    activation_bytes: int
    """Kept for the backward pass, computed from the input."""
    recompute_bytes: int
    """The largest recomputed block's activations (0 without recomputation)."""
    weight_copy_bytes: int
    """Casts of the weights the backward pass reads (the compute-precision copies)."""
    forward_flops: int
    """Matrix-multiply FLOPs of one forward pass of the batch."""

    @property
    def training_flops_per_example(self) -> float:
        return 3 * self.forward_flops / self.batch


def _input_signature(model, batch: int):
    def spec(tensor):
        return tf.TensorSpec([batch, *tensor.shape[1:]], tensor.dtype, name=tensor.name.split(":")[0])

    return tf.nest.map_structure(spec, model.input)


def _specs(structure):
    """TensorSpecs of a structure of tensors (the targets of a synthetic batch)."""
    return tf.nest.map_structure(lambda tensor: tf.TensorSpec(tensor.shape, tensor.dtype), structure)


def _uninitialised(next_creator, **kwargs):
    """A variable of known shape as a handle with no value: nothing is allocated for it."""
    shape = kwargs.get("shape")
    if shape is None or not tf.TensorShape(shape).is_fully_defined():
        return next_creator(**kwargs)  # a shape only its value tells (a scalar counter): made as usual
    return resource_variable_ops.UninitializedVariable(
        shape=shape,
        dtype=kwargs.get("dtype") or tf.float32,
        name=kwargs.get("name"),
        trainable=kwargs.get("trainable", True),
        synchronization=kwargs.get("synchronization") or tf.VariableSynchronization.AUTO,
        aggregation=kwargs.get("aggregation") or tf.VariableAggregation.NONE,
    )


@contextlib.contextmanager
def abstract():
    """Keras models built inside hold no memory: each variable of a known shape is a handle whose
    value is never made (TensorFlow's UninitializedVariable). Tracing and counting work on them as
    on real ones, in the same eager process; running them does not."""
    with tf.variable_creator_scope(_uninitialised):
        yield


def sum_of_outputs(inputs, targets, outputs):
    """The objective of a model traced without its task: every output summed (counts no loss)."""
    return tf.add_n([tf.reduce_sum(tf.cast(each, tf.float32)) for each in tf.nest.flatten(outputs)])


def task_objective(task, objective_config, manifest: dict):
    """`(inputs, targets, outputs) -> scalar`: the task's training loss, as the step computes it
    (its `step_loss` when it has one, else the mean of its `loss`)."""
    step_loss = task.step_loss(objective_config, manifest)
    if step_loss is not None:

        def objective(inputs, targets, outputs):
            values = step_loss(inputs, targets, outputs, None)
            return tf.cast(values["loss"] if isinstance(values, dict) else values, tf.float32)

        return objective
    loss = task.loss(objective_config, manifest)
    return lambda inputs, targets, outputs: tf.cast(loss(targets, outputs), tf.float32)


def _bytes(tensor) -> int:
    shape = tensor.shape
    if not shape.is_fully_defined() or tensor.dtype in (tf.resource, tf.variant, tf.string):
        return 0
    return shape.num_elements() * tensor.dtype.size


def _root(tensor):
    while tensor.op.type in _ALIASES and tensor.op.inputs:
        tensor = tensor.op.inputs[0]
    return tensor


def _multiply_flops(op) -> int:
    """2 x the multiply-adds of a matrix multiply, einsum or convolution with static shapes."""
    out = op.outputs[0].shape
    if not out.is_fully_defined():
        return 0
    if op.type == "Einsum":
        equation = op.get_attr("equation").decode()
        inputs, _ = equation.split("->")
        sizes = {}
        for term, tensor in zip(inputs.split(","), op.inputs):
            for letter, size in zip(term.replace("...", ""), tensor.shape[-len(term.replace("...", "")) :]):
                sizes[letter] = size
        total = 1
        for size in sizes.values():
            total *= size or 1
        batch_dims = len(out) - len(equation.split("->")[1].replace("...", ""))
        for size in out[:batch_dims]:
            total *= size
        return 2 * total
    a = op.inputs[0].shape
    if op.type == "MatMul":
        depth = a[-2] if op.get_attr("transpose_a") else a[-1]
    elif op.type.startswith("BatchMatMul"):
        depth = a[-2] if op.get_attr("adj_x") else a[-1]
    else:  # convolutions: the kernel's window times its input channels (depthwise: the window)
        kernel = op.inputs[1].shape
        depth = kernel[:-2].num_elements() * (1 if op.type.startswith("Depthwise") else kernel[-2])
    return 2 * out.num_elements() * int(depth)


def _reach(graph, operations) -> tuple[set[int], int]:
    """(what the input reaches: the activations, not the weights or their casts; the FLOPs of the
    matrix multiplies among them)."""
    reached = {id(tensor) for tensor in graph.inputs if tensor.dtype != tf.resource}
    flops = 0
    for op in operations:
        if any(id(tensor) in reached for tensor in op.inputs):
            reached.update(id(tensor) for tensor in op.outputs)
            if op.type in _MULTIPLIES:
                flops += _multiply_flops(op)
    return reached, flops


def forward_flops(model, batch: int) -> int:
    """Matrix-multiply FLOPs of one forward pass of `batch` examples, from the traced inference
    call (its multiplies are training's; tracing needs no replica context and runs nothing)."""
    graph = (
        tf.function(lambda inputs: model(inputs, training=False))
        .get_concrete_function(_input_signature(model, batch))
        .graph
    )
    return _reach(graph, graph.get_operations())[1]


def trace(model, batch: int, objective=sum_of_outputs, targets=None) -> Trace:
    """One training step of `model` on `batch` examples, traced (not run) and counted: the
    gradients of `objective(inputs, targets, outputs)` (the task's loss, `task_objective`), with
    `targets` a structure of TensorSpecs of the batch's targets (None: no targets)."""
    marks = {}

    def step(inputs, targets):
        with tf.GradientTape() as tape:
            outputs = model(inputs, training=True)
            loss = objective(inputs, targets, outputs)
        marks["backward"] = len(tf.compat.v1.get_default_graph().get_operations())
        return tape.gradient(loss, model.trainable_variables)

    graph = tf.function(step).get_concrete_function(_input_signature(model, batch), targets).graph
    operations = graph.get_operations()
    forward, backward = operations[: marks["backward"]], operations[marks["backward"] :]
    reached, flops = _reach(graph, forward)
    kept: dict[int, int] = {}
    copies: dict[int, int] = {}
    forward_ids = {id(op) for op in forward}
    # Only the backward ops the gradients need: the unfused graph also computes gradients nobody
    # reads (a dropout mask's), which XLA removes.
    needed = _ancestors(graph.outputs)
    backward = [op for op in backward if id(op) in needed]
    # A recomputed block's forward pass runs again in the backward pass (core/recompute.py, under a
    # `recompute_<block>` name scope); what its gradient reads of it lives until that block is done.
    recomputed: dict[str, dict[int, int]] = {}
    for op in backward:
        own = re.match(r"(recompute_[^/]*)/", op.name)
        for tensor in op.inputs:
            producer = re.match(r"(recompute_[^/]*)/", tensor.op.name)
            if producer and (not own or own.group(1) != producer.group(1)):
                root = _root(tensor)
                if not _is_weight(root):
                    recomputed.setdefault(producer.group(1), {})[id(root)] = _kept_bytes(root)
            if id(tensor.op) not in forward_ids:
                continue
            root = _root(tensor)
            if id(tensor) in reached or id(root) in reached or _is_mask(root):
                kept[id(root)] = _kept_bytes(root)
            elif root.op.type == "Cast" and _root(root.op.inputs[0]).op.type == "ReadVariableOp":
                # a compute-precision copy of a weight
                copies[id(root)] = _bytes(root)
    return Trace(
        batch=batch,
        activation_bytes=sum(kept.values()),
        recompute_bytes=max((sum(block.values()) for block in recomputed.values()), default=0),
        weight_copy_bytes=sum(copies.values()),
        forward_flops=flops,
    )


def _ancestors(tensors) -> set[int]:
    """The ops that compute `tensors`, transitively."""
    seen: set[int] = set()
    stack = [tensor.op for tensor in tensors]
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        stack.extend(tensor.op for tensor in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _is_weight(tensor) -> bool:
    """A variable's value, a constant, or a cast of a variable's value."""
    if tensor.op.type == "Cast" and tensor.op.inputs:
        tensor = _root(tensor.op.inputs[0])
    return tensor.op.type in ("ReadVariableOp", "Const")


def _is_mask(tensor) -> bool:
    """A dropout mask: booleans, or booleans cast to the compute dtype for a multiply."""
    if tensor.op.type == "Cast" and tensor.op.inputs:
        tensor = _root(tensor.op.inputs[0])
    return tensor.dtype == tf.bool and tensor.op.type != "Const"


def _kept_bytes(tensor) -> int:
    """What XLA keeps of a tensor the backward pass reads: a mask as one byte per element (a
    predicate), anything else in its own dtype; a scalar (a loss's divisor) as nothing."""
    if tensor.shape.rank == 0:
        return 0
    if _is_mask(tensor) and tensor.shape.is_fully_defined():
        return tensor.shape.num_elements()
    return _bytes(tensor)


# ------------------------------------------------------------------------------------ the plan


def optimizer_slot_elements(optimizer: str, shapes: list[tuple[int, ...]], momentum: float = 0.9) -> int:
    """Numbers the optimizer keeps per weight: SGD one momentum (none without momentum), AdamW two
    moments, Adafactor a row and a column second moment per matrix (a full one for vectors)."""
    total = 0
    for shape in shapes:
        size = 1
        for dim in shape:
            size *= dim
        if optimizer == "adamw":
            total += 2 * size
        elif optimizer == "adafactor":
            total += size if len(shape) < 2 else size // shape[-1] + size // shape[-2]
        elif momentum:
            total += size
    return total


@dataclass(frozen=True)
class Plan:
    """One replica's memory, in bytes, for a model, a batch and the memory levers in use."""

    weights: int
    gradients: int
    accumulator: int
    optimizer_slots: int
    weight_copies: int
    activations: int
    hbm: int
    """The replica's HBM (a chip's, or a TensorCore's on v2/v3); 0 when unknown."""

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.gradients
            + self.accumulator
            + self.optimizer_slots
            + self.weight_copies
            + self.activations
        )

    @property
    def usable(self) -> int:
        return int(self.hbm * (1 - XLA_RESERVE))

    @property
    def state(self) -> int:
        """What does not shrink with the batch: weights, gradients, accumulator and slots."""
        return self.weights + self.gradients + self.accumulator + self.optimizer_slots + self.weight_copies

    def fits(self) -> bool:
        return self.total <= self.usable

    def verdict(self) -> str:
        """'pass' within WARN_SHARE of what it may use, 'warn' up to all of it, 'fail' beyond."""
        if self.total <= WARN_SHARE * self.usable:
            return "pass"
        return "warn" if self.fits() else "fail"

    def breakdown(self) -> str:
        parts = (
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("accumulator", self.accumulator),
            ("optimizer slots", self.optimizer_slots),
            ("weight copies", self.weight_copies),
            ("activations", self.activations),
        )
        return ", ".join(f"{name} {gib(value)}" for name, value in parts if value)


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB" if value < 10 * GIB else f"{value / GIB:.1f} GiB"


def plan(
    trace: Trace,
    shapes: list[tuple[int, ...]],
    trainable: list[tuple[int, ...]],
    *,
    per_replica_batch: int,
    optimizer: str,
    momentum: float,
    accumulation_steps: int,
    hbm: int,
) -> Plan:
    """The memory of one replica training `per_replica_batch` examples per step (a micro-batch
    under accumulation) with the traced model."""

    def elements(each):
        total = 0
        for shape in each:
            size = 1
            for dim in shape:
                size *= dim
            total += size
        return total

    scale = per_replica_batch / trace.batch
    return Plan(
        weights=4 * elements(shapes),
        gradients=4 * elements(trainable),
        accumulator=4 * elements(trainable) if accumulation_steps > 1 else 0,
        optimizer_slots=4 * optimizer_slot_elements(optimizer, trainable, momentum),
        weight_copies=trace.weight_copy_bytes,
        activations=int((trace.activation_bytes + trace.recompute_bytes) * scale),
        hbm=hbm,
    )


def shapes(variables) -> list[tuple[int, ...]]:
    return [tuple(int(dim) for dim in variable.shape) for variable in variables]


@contextlib.contextmanager
def _building(precision_name: str):
    """Without memory (`abstract`), under the Keras policy of `precision_name`."""
    with abstract(), precision_lib.policy("mixed_bfloat16" if precision_name == "bfloat16" else "float32"):
        yield


class Planner:
    """Plans of one config's model, built from shapes (`abstract`) once per precision and remat
    setting and traced once each with the task's loss: activations scale with the batch, so one
    trace serves every batch size and every lever that keeps the model."""

    def __init__(self, cfg, task, manifest: dict):
        self.cfg, self.manifest, self.task = cfg, manifest, task
        self.models: dict = {}
        self.traces: dict = {}

    def model(self, remat=None, precision_name: str = "bfloat16"):
        """The config's model as training builds it (core/model.py; `remat` None: as configured),
        built without memory."""
        from . import model as model_lib

        key = (remat, precision_name)
        if key not in self.models:
            cfg = self.cfg
            if remat is not None:
                cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=remat))
            with _building(precision_name):
                self.models[key] = model_lib.build_model(cfg, self.task, self.manifest)
        return self.models[key]

    def traced(self, remat, precision_name: str, batch: int) -> tuple[Trace, list, list]:
        """(the trace, the weights' shapes, the trainable weights' shapes) of the model."""
        key = (remat, precision_name)
        if key not in self.traces:
            model = self.model(remat, precision_name)
            with _building(precision_name):
                _, targets = self.task.synthetic_batch(batch, self.manifest)
                objective = task_objective(self.task, self.cfg.objective, self.manifest)
                self.traces[key] = (
                    trace(model, batch, objective, _specs(targets)),
                    shapes(model.weights),
                    shapes(model.trainable_weights),
                )
        return self.traces[key]

    def plan(
        self,
        per_replica_batch: int,
        hbm: int,
        *,
        precision_name: str,
        remat=None,
        optimizer: str | None = None,
        accumulation: int = 1,
    ) -> Plan:
        """One replica training `per_replica_batch` examples per micro-batch; `accumulation` and
        `optimizer` on top of the config's (the levers)."""
        train = self.cfg.train
        traced, weights, trainable = self.traced(remat, precision_name, per_replica_batch)
        return plan(
            traced,
            weights,
            trainable,
            per_replica_batch=per_replica_batch,
            optimizer=optimizer or train.optimizer,
            momentum=train.momentum,
            accumulation_steps=accumulation * train.gradient_accumulation_steps,
            hbm=hbm,
        )


def estimate_for(cfg, task, manifest: dict, per_replica_batch: int, hbm: int) -> Plan:
    """The plan of the config's model training `per_replica_batch` examples per replica and step
    (a micro-batch under accumulation) in the config's precision (`auto` counts as bfloat16, the
    TPU's), built from shapes: any size plans in seconds, nothing allocated."""
    precision_name = "float32" if cfg.runtime.mixed_precision == "float32" else "bfloat16"
    return Planner(cfg, task, manifest).plan(per_replica_batch, hbm, precision_name=precision_name)
