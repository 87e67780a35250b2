"""What a training step holds in a chip's memory, and what it computes, read from the traced step.

`trace(model, batch, objective)` traces one training step (forward pass, the task's loss,
gradients) of any Keras model into a graph without running it, and reads from that graph:
- the activations kept for the backward pass: every tensor computed from the input (or the
  targets) that an op of the backward pass reads, in the dtype it has (bfloat16 under mixed
  precision), counted once. The loss is the task's own (`build_loss`, or `build_step_loss`), so the
  float32 logits that a softmax cross-entropy keeps are counted; a dropout mask is counted at one
  byte per element (XLA keeps it as a predicate), whatever dtype the unfused graph casts it to;
  with recomputation (`model.remat`) these are the blocks' inputs, plus the largest block's
  recomputed activations, which live during that block's backward pass;
- what loops keep for the backward pass: the intermediates a loop's gradient reads, stacked at
  every iteration (while_v2's accumulators), times the loop's length (see "loops and called
  functions" below);
- the weight copies the backward pass reads (the bfloat16 casts of float32 variables);
- the model's FLOPs: 2 x M x N x K for every matrix multiply, einsum and convolution of the
  forward pass (inside the functions it calls, and a loop's body times the loop's length), times
  3 for a training step (the backward pass multiplies twice: once for the input's gradient, once
  for the weight's). Recomputation adds hardware FLOPs, not model FLOPs. What cannot be counted
  (a loop whose length is known only when it runs, a multiply of unknown shape) is named
  (`Flops.unknown`, `Trace.unplanned`), never counted as nothing.

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
is an estimate: XLA fuses elementwise ops (keeping less) and allocates temporaries (more, a
loop's within one iteration among them); `make bench-memory` measures it against the process's
memory on this machine, and the README gives the factor seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass

import numpy as np
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
# Ops that run a function of the graph's library: a call, a loop (its body, as many times as its
# condition allows), a branch (one of its functions).
_CALLS = {"PartitionedCall", "StatefulPartitionedCall"}
_LOOPS = {"While", "StatelessWhile"}
_BRANCHES = {"If", "StatelessIf", "Case", "StatelessCase"}


@dataclass(frozen=True)
class Flops:
    """FLOPs counted in a traced graph and what could not be counted, each naming where (a loop of
    unknown length, a multiply of unknown shape); a count with something `unknown` is too low."""

    counted: int = 0
    unknown: tuple[str, ...] = ()
    frozen: int = 0
    """Of `counted`: the multiplies of a weight that does not train (`train.freeze`), whose weight
    gradient the training step does not compute."""

    def __add__(self, other: Flops) -> Flops:
        unknown = tuple(dict.fromkeys(self.unknown + other.unknown))
        return Flops(self.counted + other.counted, unknown, self.frozen + other.frozen)

    def times(self, count: int) -> Flops:
        return Flops(self.counted * count, self.unknown, self.frozen * count)

    @property
    def training(self) -> int:
        """A training step's: each multiply forward, for its input's gradient and for its weight's
        (3 x), less the weight gradients of the frozen weights' multiplies."""
        return 3 * self.counted - self.frozen


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
    """Matrix-multiply FLOPs of one forward pass of the batch, loop bodies times their lengths."""
    frozen_flops: int = 0
    """Of `forward_flops`: the multiplies of frozen weights (`Flops.frozen`)."""
    unknown_flops: tuple[str, ...] = ()
    """What `forward_flops` could not count (`Flops.unknown`)."""
    loop_bytes: int = 0
    """Of `activation_bytes`: what loops stack for the backward pass (each iteration's
    intermediates that the loop's gradient reads, times the iterations)."""
    unplanned: tuple[str, ...] = ()
    """What is kept but could not be counted (the stack of a loop of unknown length)."""

    @property
    def training_flops_per_example(self) -> float:
        return Flops(self.forward_flops, frozen=self.frozen_flops).training / self.batch


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


def task_objective(task, model, objective_config, manifest: dict):
    """`(inputs, targets, outputs) -> scalar`: the task's training loss of `model`, as the step
    computes it (its step loss when it has one, else the mean of its loss)."""
    step_loss = task.build_step_loss(objective_config, manifest)
    if step_loss is not None:

        def objective(inputs, targets, outputs):
            values = step_loss(model, inputs, targets, outputs, None)
            return tf.cast(values["loss"] if isinstance(values, dict) else values, tf.float32)

        return objective
    loss = task.build_loss(objective_config, manifest)
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


def _multiply_flops(op) -> int | None:
    """2 x the multiply-adds of a matrix multiply, einsum or convolution with static shapes (None
    when a shape is known only when it runs)."""
    out = op.outputs[0].shape
    if not out.is_fully_defined():
        return None
    if op.type == "Einsum":
        equation = op.get_attr("equation").decode()
        inputs, _ = equation.split("->")
        sizes = {}
        for term, tensor in zip(inputs.split(","), op.inputs):
            for letter, size in zip(term.replace("...", ""), tensor.shape[-len(term.replace("...", "")) :]):
                sizes[letter] = size
        if None in sizes.values():
            return None
        total = 1
        for size in sizes.values():
            total *= size
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
    if depth is None:
        return None
    return 2 * out.num_elements() * int(depth)


def _reach(graph, operations, results, model=None) -> tuple[set[int], Flops]:
    """(what the input reaches: the activations, not the weights or their casts, in the graph and
    in the functions it runs; the FLOPs of the matrix multiplies among them, those of `model`'s
    frozen weights apart). Only what computes `results` counts: tf_keras' rnn computes one step
    before its loop for the shapes alone."""
    reached = {id(tensor) for tensor in graph.inputs if tensor.dtype != tf.resource}
    frame = _Frame(graph, frozen=_frozen_handles(graph, model))
    return reached, _graph_flops(frame, reached, operations, live=_ancestors(results))


def _frozen_handles(graph, model) -> frozenset:
    """ids of `graph`'s handles (its captures) of `model`'s weights that do not train."""
    if model is None:
        return frozenset()
    frozen = {id(handle) for variable in model.non_trainable_weights for handle in _handles(variable)}
    return frozenset(id(inner) for outer, inner in graph.captures if id(outer) in frozen)


def _handles(variable) -> list:
    """A variable's resource handles: a distributed variable's, each replica's."""
    values = getattr(variable, "values", None)
    return [value.handle for value in values] if values else [variable.handle]


def _reads_frozen(op, frame: _Frame) -> bool:
    """Whether a multiply reads a weight that does not train (through casts, and through the
    functions that pass it in)."""
    if not frame.frozen:
        return False
    for tensor in op.inputs:
        root, _ = _source(tensor, frame)
        if root.op.type == "Cast" and root.op.inputs:
            root, _ = _source(root.op.inputs[0], frame)
        if root.op.type == "ReadVariableOp" and id(_source(root.op.inputs[0], frame)[0]) in frame.frozen:
            return True
    return False


def count_forward(model, batch: int) -> Flops:
    """Matrix-multiply FLOPs of one forward pass of `batch` examples, from the traced inference
    call (its multiplies are training's; tracing needs no replica context and runs nothing), loop
    bodies (an LSTM's steps) included, and what could not be counted."""
    graph = (
        tf.function(lambda inputs: model(inputs, training=False))
        .get_concrete_function(_input_signature(model, batch))
        .graph
    )
    return _reach(graph, graph.get_operations(), graph.outputs, model)[1]


def forward_flops(model, batch: int) -> int:
    """`count_forward`'s count (too low when it names something it could not count)."""
    return count_forward(model, batch).counted


def trace(model, batch: int, objective=sum_of_outputs, targets=None) -> Trace:
    """One training step of `model` on `batch` examples, traced (not run) and counted: the
    gradients of `objective(inputs, targets, outputs)` (the task's loss, `task_objective`), with
    `targets` a structure of TensorSpecs of the batch's targets (None: no targets)."""
    marks = {}

    def step(inputs, targets):
        with tf.GradientTape() as tape:
            outputs = model(inputs, training=True)
            loss = objective(inputs, targets, outputs)
        marks["backward"], marks["loss"] = len(tf.compat.v1.get_default_graph().get_operations()), loss
        return tape.gradient(loss, model.trainable_variables)

    graph = tf.function(step).get_concrete_function(_input_signature(model, batch), targets).graph
    operations = graph.get_operations()
    forward, backward = operations[: marks["backward"]], operations[marks["backward"] :]
    reached, flops = _reach(graph, forward, [*graph.outputs, marks["loss"]], model)
    kept: dict[int, int] = {}
    copies: dict[int, int] = {}
    loops: dict[int, int] = {}
    unplanned: list[str] = []
    top = _Frame(graph)
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
            # Through the functions the forward pass calls (an LSTM's): what one computes, or what
            # its caller passed in (the LSTM's weights).
            root, frame = _source(tensor, top)
            passed = root is not _root(tensor)
            if root.dtype == tf.variant:
                if id(tensor) in reached:  # a loop's stack, or a sequence split into a list
                    loops[id(root)], copies[id(root)], missing = _stacked(root, frame, reached)
                    unplanned.extend(missing)
            elif id(root) in reached or (id(tensor) in reached and not passed) or _is_mask(root):
                kept[id(root)] = _kept_bytes(root)
            elif root.op.type == "Cast" and _root(root.op.inputs[0]).op.type == "ReadVariableOp":
                # a compute-precision copy of a weight
                copies[id(root)] = _bytes(root)
    return Trace(
        batch=batch,
        activation_bytes=sum(kept.values()) + sum(loops.values()),
        recompute_bytes=max((sum(block.values()) for block in recomputed.values()), default=0),
        weight_copy_bytes=sum(copies.values()),
        forward_flops=flops.counted,
        frozen_flops=flops.frozen,
        unknown_flops=flops.unknown,
        loop_bytes=sum(loops.values()),
        unplanned=tuple(dict.fromkeys(unplanned)),
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


# ------------------------------------------------------------------ loops and called functions
# A Keras LSTM or GRU is a function of the graph's library (tf_keras' `standard_lstm`, which the
# runtime may swap for a fused kernel) around a While loop over the time steps (backend.rnn); other
# recurrent layers, `tf.map_fn` and `tf.scan` are While loops in the graph itself. Their FLOPs are
# the body's times the loop's length, read from its condition: a counter that starts at, and moves
# by, values known before running, compared with a value known before running (the time steps of
# the sequence, or the loop's maximum_iterations). The gradient of a loop reads what its forward
# pass pushed on a stack at every iteration (while_v2's accumulators): what the step keeps.

_COMPARISONS = {  # each comparison, and the same read from its right side
    "Less": "Greater",
    "LessEqual": "GreaterEqual",
    "Greater": "Less",
    "GreaterEqual": "LessEqual",
    "NotEqual": "NotEqual",
}
_ARITHMETIC = {
    "Add": np.add,
    "AddV2": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "FloorDiv": np.floor_divide,
    "Maximum": np.maximum,
    "Minimum": np.minimum,
}


@dataclass(frozen=True)
class _Frame:
    """A graph being read: the traced step's, or a function's that it runs, with the tensor its
    caller binds to each of the function's inputs (in the caller's frame) where that is one value
    (a loop's body: the inputs that do not change between iterations). `where` names the layer
    (the name scope of the op of the traced step that runs it) in what cannot be counted."""

    graph: object
    where: str = ""
    bindings: dict = dataclasses.field(default_factory=dict)
    frozen: frozenset = frozenset()
    """ids of the traced step's handles of the weights that do not train."""

    def named(self, op) -> str:
        return self.where or op.name.rpartition("/")[0] or op.name


def _function(op, attr: str, index: int | None = None):
    """The graph of a function an op runs (a call's `f`, a loop's `body` or `cond`, a branch)."""
    value = op.get_attr(attr)
    name = (value[index] if index is not None else value).name
    graph = op.graph
    while graph is not None:
        found = graph._get_function(name)  # the function library that tracing filled
        if found is not None:
            return found.graph
        graph = getattr(graph, "outer_graph", None)
    raise ValueError(f"{op.name} runs {name}, which its graph does not hold")


def _inside(op, graph, frame: _Frame, inputs=None) -> _Frame:
    """The frame of `graph` as `op` (in `frame`) calls it with `inputs` (its own, by default)."""
    inputs = op.inputs if inputs is None else inputs
    bindings = {id(inner): (outer, frame) for inner, outer in zip(graph.inputs, inputs)}
    return _Frame(graph, frame.named(op), bindings, frame.frozen)


def _invariant(body) -> set[int]:
    """The loop variables a While body passes on unchanged (the tensors it captures)."""
    return {index for index, (inner, out) in enumerate(zip(body.inputs, body.outputs)) if _root(out) is inner}


def _loop_frame(op, graph, frame: _Frame) -> _Frame:
    """A loop's body or condition, its unchanging variables bound to their values outside."""
    bound = {id(graph.inputs[index]): (op.inputs[index], frame) for index in _invariant(_function(op, "body"))}
    return _Frame(graph, frame.named(op), bound, frame.frozen)


def _source(tensor, frame: _Frame):
    """What a tensor is, through aliases and the functions that pass it on (a call's output: what
    its function computes; a function's input: what its caller binds; a loop's variable that its
    body does not change: its value before the loop): (the tensor, its frame)."""
    while True:
        tensor = _root(tensor)
        if tensor.op.type in _CALLS:
            graph = _function(tensor.op, "f")
            tensor, frame = graph.outputs[tensor.value_index], _inside(tensor.op, graph, frame)
        elif tensor.op.type in _LOOPS and tensor.value_index in _invariant(_function(tensor.op, "body")):
            tensor = tensor.op.inputs[tensor.value_index]
        elif id(tensor) in frame.bindings:
            tensor, frame = frame.bindings[id(tensor)]
        else:
            return tensor, frame


def _static(tensor, frame: _Frame):
    """The value of a small integer tensor known before running (a constant, a dimension of a
    static shape, a slice, sum or product of them), through the functions that pass it; None if it
    is known only when it runs."""
    tensor, frame = _source(tensor, frame)
    if tensor.dtype not in (tf.int32, tf.int64):
        return None
    value = tf.get_static_value(tensor)
    if value is not None:
        return np.asarray(value)
    op = tensor.op
    if op.type in _ARITHMETIC or op.type in ("StridedSlice", "Pack", "Cast", "Max", "Min"):
        values = [_static(each, frame) for each in op.inputs]
        if any(value is None for value in values):
            return None
        if op.type in _ARITHMETIC:
            return _ARITHMETIC[op.type](*values)
        if op.type == "Pack":
            return np.stack(values, axis=op.get_attr("axis"))
        if op.type == "Cast":
            return values[0]
        if op.type in ("Max", "Min"):  # tf_keras' rnn under XLA: maximum_iterations = max(lengths)
            reduce = np.max if op.type == "Max" else np.min
            return reduce(values[0], axis=tuple(np.atleast_1d(values[1])), keepdims=op.get_attr("keep_dims"))
        return _slice(op, *values)
    return None


def _slice(op, data, begin, end, strides):
    """A StridedSlice of a vector (`tf.shape(x)[0]`, `shape[1:]`); None for any other."""
    if data.ndim != 1 or begin.shape != (1,) or op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
        return None
    if op.get_attr("shrink_axis_mask") & 1:
        return data[begin[0]]
    start = None if op.get_attr("begin_mask") & 1 else begin[0]
    stop = None if op.get_attr("end_mask") & 1 else end[0]
    return data[start : stop : strides[0]]


def _conjuncts(tensor) -> list:
    tensor = _root(tensor)
    if tensor.op.type == "LogicalAnd":
        return [*_conjuncts(tensor.op.inputs[0]), *_conjuncts(tensor.op.inputs[1])]
    return [tensor]


def _trip_count(op, frame: _Frame) -> int | None:
    """How many times a While loop runs its body: every test of its condition (tests joined by
    `and`) compares a counter (a loop variable that starts at, and moves by, values known before
    running) with a value known before running; None when a test is anything else (a loop that
    ends on its data runs a number of times known only when it runs)."""
    cond, body = _function(op, "cond"), _function(op, "body")
    cond_frame, body_frame, invariant = _loop_frame(op, cond, frame), _loop_frame(op, body, frame), _invariant(body)
    bounds = []
    for test in _conjuncts(cond.outputs[0]):
        if test.op.type not in _COMPARISONS:
            return None
        left, right = (_root(each) for each in test.op.inputs)
        counted = [
            (index, limit, comparison)
            for counter, limit, comparison in ((left, right, test.op.type), (right, left, _COMPARISONS[test.op.type]))
            for index, inner in enumerate(cond.inputs)
            if counter is inner and index not in invariant
        ]
        if len(counted) != 1:
            return None
        index, limit, comparison = counted[0]
        end, start = _static(limit, cond_frame), _static(op.inputs[index], frame)
        step = _step(body, index, body_frame)
        if end is None or start is None or not step or end.shape or start.shape or step.shape:
            return None
        bound = _iterations(int(start), int(step), int(end), comparison)
        if bound is None:
            return None
        bounds.append(bound)
    return min(bounds) if bounds else None


def _step(body, index: int, body_frame: _Frame):
    """What a loop's body adds to loop variable `index` at every iteration (None if not that)."""
    out = _root(body.outputs[index])
    if out.op.type not in ("Add", "AddV2", "Sub"):
        return None
    left, right = (_root(each) for each in out.op.inputs)
    if left is body.inputs[index]:
        step = _static(right, body_frame)
        return None if step is None else (-step if out.op.type == "Sub" else step)
    if right is body.inputs[index] and out.op.type != "Sub":
        return _static(left, body_frame)
    return None


def _iterations(start: int, step: int, end: int, comparison: str) -> int | None:
    """How many of start, start + step, ... pass `value <comparison> end` before one fails; None
    when they never fail."""
    if comparison in ("Less", "LessEqual") and step > 0:
        return max(0, -((start - end) // step) if comparison == "Less" else (end - start) // step + 1)
    if comparison in ("Greater", "GreaterEqual") and step < 0:
        return max(0, -((end - start) // -step) if comparison == "Greater" else (start - end) // -step + 1)
    if comparison == "NotEqual" and (end - start) % step == 0 and (end - start) // step >= 0:
        return (end - start) // step  # a counter that lands on `end` (one that steps over it never stops)
    return None


def _graph_flops(frame: _Frame, reached: set[int], operations=None, live: set[int] | None = None) -> Flops:
    """The FLOPs of the multiplies that the reached tensors reach in `operations` (all of the
    frame's), those of the functions they run included; `reached` grows with what they reach."""
    total = Flops()
    for op in frame.graph.get_operations() if operations is None else operations:
        if live is not None and id(op) not in live:
            continue
        reaches = [id(tensor) in reached for tensor in op.inputs]
        if not any(reaches):
            continue
        reached.update(id(tensor) for tensor in op.outputs)
        if op.type in _MULTIPLIES:
            flops = _multiply_flops(op)
            unknown = () if flops is not None else (f"a multiply of unknown shape in {frame.named(op)}",)
            total += Flops(flops or 0, unknown, (flops or 0) if _reads_frozen(op, frame) else 0)
        elif op.type in _CALLS | _LOOPS | _BRANCHES:
            try:
                if op.type in _CALLS:
                    graph = _function(op, "f")
                    total += _function_flops(graph, _inside(op, graph, frame), reaches, reached)
                else:
                    total += (_loop_flops if op.type in _LOOPS else _branch_flops)(op, frame, reaches, reached)
            except ValueError as failure:  # a function the library does not hold: said, not fatal
                total += Flops(0, (f"a function it could not read in {frame.named(op)} ({failure})",))
    return total


def _function_flops(graph, frame: _Frame, reaches: list[bool], reached: set[int]) -> Flops:
    """A function's FLOPs from the inputs that `reaches` marks, counting only what its outputs
    need (as in the traced step: `_reach`)."""
    reached.update(id(inner) for inner, reach in zip(graph.inputs, reaches) if reach)
    return _graph_flops(frame, reached, live=_ancestors(graph.outputs))


def _loop_flops(op, frame: _Frame, reaches: list[bool], reached: set[int]) -> Flops:
    """A While loop's FLOPs: its body's times its trip count (a loop variable that the input
    reaches in one iteration is reached in the next)."""
    body = _function(op, "body")
    inner = _loop_frame(op, body, frame)
    while True:
        count = _function_flops(body, inner, reaches, reached)
        grown = [reach or id(out) in reached for reach, out in zip(reaches, body.outputs)]
        if grown == reaches:
            break
        reaches = grown
    if not count.counted and not count.unknown:
        return count
    trips = _trip_count(op, frame)
    if trips is None:
        return Flops(0, (f"a loop of unknown length in {frame.named(op)}", *count.unknown))
    return count.times(trips)


def _branch_flops(op, frame: _Frame, reaches: list[bool], reached: set[int]) -> Flops:
    """An If's or a Case's FLOPs: its costliest branch's (which one runs is known when it runs)."""
    if "If" in op.type:
        graphs = [_function(op, "then_branch"), _function(op, "else_branch")]
    else:
        graphs = [_function(op, "branches", index) for index in range(len(op.get_attr("branches")))]
    inputs = op.inputs[1:]  # after the condition or the branch's index
    counts = [_function_flops(graph, _inside(op, graph, frame, inputs), reaches[1:], reached) for graph in graphs]
    unknown = sum((Flops(0, count.unknown) for count in counts), Flops())
    costliest = max(counts, key=lambda count: count.counted)
    return Flops(costliest.counted, frozen=costliest.frozen) + unknown


def _stacked(tensor, frame: _Frame, reached: set[int]) -> tuple[int, int, tuple[str, ...]]:
    """What a list (a variant tensor) that the backward pass reads holds for it: a loop's stack of
    what its body pushes at every iteration, times its trip count, as (bytes of activations: what
    the input reaches, bytes of weights: a weight read inside the body, as a Keras cell outside
    the fused LSTM and GRU reads its kernel, is stacked at every iteration too; what could not be
    counted: a loop of unknown length).
    A sequence split into a list for a loop to read (a TensorArray) is read back for its shape
    alone (the zero gradient of a loop variable that does not change): nothing."""
    tensor, frame = _source(tensor, frame)
    op = tensor.op
    if op.type not in _LOOPS:
        return 0, 0, ()
    index, body = tensor.value_index, _function(op, "body")
    activations, weights, unknown = _stacked(op.inputs[index], frame, reached)
    out = _root(body.outputs[index])
    if out.op.type != "TensorListPushBack" or _root(out.op.inputs[0]) is not body.inputs[index]:
        return activations, weights, unknown  # passed on unchanged, or written in place
    trips = _trip_count(op, frame)
    if trips is None:
        return activations, weights, (*unknown, f"what a loop of unknown length in {frame.named(op)} keeps")
    element = _root(out.op.inputs[1])
    if element.dtype == tf.variant:  # an inner loop's stack, pushed at every iteration of this one
        inner = _stacked(element, _loop_frame(op, body, frame), reached)
        return activations + trips * inner[0], weights + trips * inner[1], (*unknown, *inner[2])
    if id(element) in reached or _is_mask(element):
        return activations + trips * _kept_bytes(element), weights, unknown
    return activations, weights + trips * _kept_bytes(element), unknown


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
    loops: int = 0
    """Of `activations`: what loops stack for the backward pass (`Trace.loop_bytes`)."""
    left_out: tuple[str, ...] = ()
    """What is kept but could not be counted (`Trace.unplanned`)."""

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
        text = ", ".join(f"{name} {gib(value)}" for name, value in parts if value)
        if self.loops:
            text += f" (of which loops stack {gib(self.loops)} for the backward pass)"
        if self.left_out:
            text += f"; not counted: {'; '.join(self.left_out)}"
        return text


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
        loops=int(trace.loop_bytes * scale),
        left_out=trace.unplanned,
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
                objective = task_objective(self.task, model, self.cfg.objective, self.manifest)
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
