"""`make doctor`: checks the config, the model, the data and the machine against the Cloud TPU
performance guide before any TPU time is spent.

    python -m {{ cookiecutter.package }}.doctor --config FILE [--tpu_type v4-32] [--target tpu] [dotted.key=value ...]

Every rule prints one line: PASS, WARN, FAIL or SKIP, what it found and, when it is not a PASS,
the fix; then a summary. The exit status is 1 when a rule FAILs (warnings alone exit 0) and 2
for an error in the command line or the config. Nothing here initialises an accelerator: the
model is built on the CPU only to list its layers, the input pipeline is built but never run,
and the TPU VM rules read device files, /proc and package metadata.

The replicas that the batch rules check against: the TPU topology of `--tpu_type` (default: the
type this project was generated for) when the config targets a TPU (`runtime.strategy=tpu`;
`auto` on a TPU VM or with a Pod slice in `runtime.tpu`; or `--target tpu` on the command
line), else `runtime.cpu_devices` (or the GPUs) of this machine.

The rules, by topic of the Cloud TPU performance guide (cloud.google.com/tpu/docs/performance-guide)
and its companion pages:

Batch size and tensor padding ("Batch size", "Tensor dimensions", "Padding"):
  batch.divisible           the global batch divides evenly across the replicas (FAIL: training refuses it)
  batch.multiple_of_8       the per-replica batch is a multiple of 8: XLA tiles the batch dimension by 8
                            and pads the rest with zeros
  batch.per_core_128        at least 128 examples per TPU core (1024 on 8 cores) to fill the MXU
Model ("Tensor dimensions", "Fully connected layers", "Batch normalization", "bfloat16"):
  model.build               the model builds (on the CPU) and has conv or dense layers to check
  model.feature_dims        Conv filters and hidden Dense units are multiples of 128 (of 8 when the global
                            batch is a multiple of 1024); the logits layer (num_classes wide) is exempt
  model.narrow_layers       layers under 128 wide use a fraction of the 128x128 MXU
  model.hidden_dense        hidden Dense layers under 512 units are too small to keep the MXU busy
  model.batch_norm          per-replica batch under 32 with per-replica batch-norm statistics
  model.precision           bfloat16 on a TPU (the MXU's native input type, half the memory traffic)
Input pipeline ("Static shapes", "Input pipeline performance", "Storage"):
  input.static_shapes       the real training and eval datasets have fully defined shapes
                            (drop_remainder=True): a dynamic shape recompiles or fails on a TPU
  data.manifest             manifest.json is present, readable, and matches features.py and data.image_size
  data.shard_count          at least 10 shards per reading host, so every host interleaves several files
  data.shard_size           shards of 10 MB or more (100 MB+ ideally): per-file overhead otherwise dominates
  data.location             a multi-host slice reads gs://: each worker sees only its own local disk
  run.location              a multi-host slice writes checkpoints and logs to gs:// too
Training loop ("Host-device round trips", steps_per_execution of the TPU training loop):
  train.steps_per_execution several steps per call into the device, more when the step is short
  train.execution_boundaries logs and checkpoints happen only between executions
The TPU VM (TPU VM troubleshooting; SKIP anywhere else):
  tpu.devices               the TPU device files (/dev/accel*, /dev/vfio/<n>) are there
  tpu.software              tensorflow-tpu at the pinned version, and libtpu, are installed
  tpu.lock_file             no stale /tmp/libtpu_lockfile and no other process holding the chips
  tpu.log_dir               TPU_LOG_DIR is writable, so libtpu's own logs are not lost
"""

from __future__ import annotations

import argparse
import functools
import glob
import importlib.metadata
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from . import config as config_lib
from . import topology as topology_lib
from .errors import UserError, run_cli

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
NOT_A_TPU_VM = "not a TPU VM"

MXU_TILE = 128  # the MXU multiplies 128x128 tiles
SMALL_TILE = 8  # XLA pads one dimension of every tensor to a multiple of 8
BATCH_FOR_SMALL_TILE = 1024  # global batch from which feature dimensions of 8k are fine
PER_CORE_BATCH = 128  # per-core batch the Cloud TPU guide recommends
MIN_HIDDEN_DENSE = 512
MIN_BN_BATCH = 32
MIN_STEP_SECONDS = 0.010  # below this, per-execution overhead is a large share of a step
MIN_SPE_FOR_SHORT_STEPS = 32
SHARDS_PER_HOST = 10
MIN_SHARD_BYTES = 10 * 2**20
IDEAL_SHARD_BYTES = 100 * 2**20

LOCK_FILE = "/tmp/libtpu_lockfile"
DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")  # as scripts/tpu_cleanup.sh
DEFAULT_TPU_LOG_DIR = "/tmp/tpu_logs"  # tpu.mk's default, and libtpu's
REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements.txt"


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True)
class Verdict:
    """What one rule found: a status, one line saying what, and one line saying how to fix it."""
    status: str
    message: str
    fix: str = ""


@dataclass(frozen=True)
class Result:
    status: str
    rule: str
    message: str
    fix: str = ""


def passed(message: str) -> Verdict:
    return Verdict(PASS, message)


def warn(message: str, fix: str) -> Verdict:
    return Verdict(WARN, message, fix)


def fail(message: str, fix: str) -> Verdict:
    return Verdict(FAIL, message, fix)


def skip(message: str) -> Verdict:
    return Verdict(SKIP, message)


def worst(*verdicts: Verdict) -> Verdict:
    """The most severe of several verdicts of one rule, their messages and fixes joined."""
    order = (SKIP, PASS, WARN, FAIL)
    status = max((v.status for v in verdicts), key=order.index)
    return Verdict(status, "; ".join(v.message for v in verdicts if v.message),
                   "; ".join(v.fix for v in verdicts if v.fix))


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} layers)" if len(names) > limit else "")


def _mb(size: float) -> str:
    return f"{size / 2**20:.1f} MB" if size < 10 * 2**20 else f"{size / 2**20:.0f} MB"


# ----------------------------------------------------------------------------- what is checked

@dataclass(frozen=True)
class Target:
    """Where the config will train: the replicas and hosts the batch and data rules check against."""
    kind: str  # 'tpu', 'gpu' or 'cpu'
    replicas: int
    hosts: int
    why: str
    tpu_type: str = ""

    def describe(self) -> str:
        what = f"TPU {self.tpu_type}" if self.kind == "tpu" else self.kind.upper()
        return (f"{what}, {self.replicas} replica{'s' if self.replicas > 1 else ''}, {self.hosts} "
                f"host{'s' if self.hosts > 1 else ''} ({self.why})")


def _gpu_count() -> int:
    return len(glob.glob("/dev/nvidia[0-9]*"))


def resolve_target(cfg: config_lib.Config, *, target: str = "auto", tpu_type: str | None = None,
                   on_tpu_vm: bool = False, gpus: int = 0) -> Target:
    """The target of `cfg`, decided as `distribute.resolve` would, without starting TensorFlow."""
    runtime = cfg.runtime
    kind, why = target, f"--target {target}"
    if kind == "auto":
        if runtime.strategy != "auto":
            kind, why = runtime.strategy, f"runtime.strategy={runtime.strategy}"
        elif on_tpu_vm:
            kind, why = "tpu", "runtime.strategy=auto on a TPU VM"
        elif runtime.tpu not in ("local", ""):
            kind, why = "tpu", f"runtime.strategy=auto with runtime.tpu={runtime.tpu}"
        elif gpus:
            kind, why = "gpu", "runtime.strategy=auto and this machine has GPUs"
        else:
            kind, why = "cpu", "runtime.strategy=auto and this is not a TPU VM"
    if kind == "tpu":
        name = tpu_type or topology_lib.DEFAULT_TPU_TYPE
        try:
            topo = topology_lib.topology(name)
        except ValueError as error:
            raise UserError(f"--tpu_type: {error}") from None
        source = "--tpu_type" if tpu_type else "the project's TPU type"
        return Target("tpu", topo.replicas, topo.hosts, f"{why}; topology of {source}", name)
    if kind == "gpu":
        return Target("gpu", max(1, gpus), 1, f"{why}; one replica per GPU")
    return Target("cpu", runtime.cpu_devices, 1, f"{why}; runtime.cpu_devices={runtime.cpu_devices}")


@dataclass(frozen=True)
class LayerInfo:
    name: str
    kind: str  # 'conv', 'dense' or 'batch_norm'
    width: int  # output features (filters, units); 0 for batch norm
    is_output: bool = False
    synchronized: bool = False


def model_layers(model) -> list[LayerInfo]:
    """The conv, dense and batch-norm layers of a Keras model, nested models included."""
    from .keras import keras

    outputs = set(model.output_names)
    found = []

    def visit(layer):
        for inner in getattr(layer, "layers", None) or []:
            visit(inner)
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(LayerInfo(layer.name, "batch_norm", 0,
                                   synchronized=bool(getattr(layer, "synchronized", False))))
        elif isinstance(layer, keras.layers.Dense):
            found.append(LayerInfo(layer.name, "dense", int(layer.units), layer.name in outputs))
        elif isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)) and \
                getattr(layer, "filters", None):
            found.append(LayerInfo(layer.name, "conv", int(layer.filters), layer.name in outputs))

    for layer in model.layers:
        visit(layer)
    return found


@dataclass(frozen=True)
class RunHistory:
    """What a previous run in runtime.output_dir measured: its config.yaml and metrics.json."""
    steps_per_execution: int | None = None
    global_batch_size: int | None = None
    examples_per_second: float | None = None

    @property
    def step_seconds(self) -> float | None:
        if self.examples_per_second and self.global_batch_size and math.isfinite(self.examples_per_second):
            return self.global_batch_size / self.examples_per_second
        return None


def read_run_history(output_dir: str) -> RunHistory:
    import tensorflow as tf
    import yaml

    def read(name: str):
        path = f"{output_dir.rstrip('/')}/{name}"
        try:
            if not tf.io.gfile.exists(path):
                return None
            with tf.io.gfile.GFile(path) as handle:
                return json.load(handle) if name.endswith(".json") else yaml.safe_load(handle)
        except (tf.errors.OpError, ValueError, yaml.YAMLError):
            return None

    run_config = read("config.yaml") or {}
    metrics = read("metrics.json") or {}
    train = run_config.get("train", {}) if isinstance(run_config, dict) else {}
    spe = train.get("steps_per_execution")
    eps = metrics.get("examples_per_second") if isinstance(metrics, dict) else None
    return RunHistory(spe if isinstance(spe, int) else None, train.get("global_batch_size"),
                      float(eps) if isinstance(eps, (int, float)) else None)


class Context:
    """The facts the rules look at, each computed once, on first use."""

    def __init__(self, cfg: config_lib.Config, target: Target, *, on_tpu_vm: bool = False):
        self.cfg, self.target, self.on_tpu_vm = cfg, target, on_tpu_vm

    @property
    def per_replica_batch(self) -> int | None:
        """The per-replica batch, or None when the global batch does not divide."""
        batch, replicas = self.cfg.train.global_batch_size, self.target.replicas
        return None if batch % replicas else batch // replicas

    @functools.cached_property
    def manifest_or_error(self) -> tuple[dict | None, str, str]:
        """(the checked manifest or None, what is wrong, the fix)."""
        import tensorflow as tf

        from . import input_pipeline

        data_dir = self.cfg.data.dir
        try:
            return input_pipeline.read_manifest(data_dir, self.cfg.data.image_size), "", ""
        except UserError as error:  # its message says what is wrong; then, after "; ", the fix
            message, _, fix = str(error).partition("; ")
            return None, message, fix or f"re-run `make preprocess` (DATA_DIR={data_dir})"
        except tf.errors.OpError as error:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return None, f"cannot read {data_dir}/manifest.json: {detail}", (
                "check data.dir and your access to it (gcloud auth application-default login; on a TPU VM the "
                "service account needs read access to the bucket)")
        except (KeyError, TypeError, AttributeError) as error:
            return None, f"{data_dir}/manifest.json lacks an expected field ({type(error).__name__}: {error})", (
                f"re-run `make preprocess` (DATA_DIR={data_dir})")

    @property
    def manifest(self) -> dict | None:
        return self.manifest_or_error[0]

    @functools.cached_property
    def model_or_error(self) -> tuple[list[LayerInfo] | None, str, str | None]:
        """(the model's layers, a one-line description, the error when it does not build)."""
        import tensorflow as tf

        from .model import build_model

        num_classes = (self.manifest or {}).get("num_classes", 10)
        try:
            with tf.device("/cpu:0"):
                model = build_model(self.cfg.model, self.cfg.data.image_size, num_classes)
        except Exception as error:  # noqa: BLE001 - a user's model may fail in any way; report it
            first_line = (str(error).strip().splitlines() or [""])[0]
            return None, "", f"{type(error).__name__}: {first_line}"
        layers = model_layers(model)
        description = f"{model.name}: {model.count_params():,} parameters, {len(layers)} conv/dense/batch-norm layers"
        return layers, description, None

    @property
    def layers(self) -> list[LayerInfo] | None:
        return self.model_or_error[0]

    @property
    def feature_layers(self) -> list[LayerInfo]:
        """Conv and hidden Dense layers: those whose width should suit the MXU."""
        return [layer for layer in self.layers or [] if layer.kind in ("conv", "dense") and not layer.is_output]

    @functools.cached_property
    def history(self) -> RunHistory:
        return read_run_history(self.cfg.runtime.output_dir)


# ----------------------------------------------------------------------------- rules

Rule = Callable[[Context], Verdict]
RULES: list[tuple[str, Rule, bool]] = []


def rule(name: str, *, tpu_vm_only: bool = False) -> Callable[[Rule], Rule]:
    """Registers a rule; the order of registration is the order of the report."""
    def register(function: Rule) -> Rule:
        RULES.append((name, function, tpu_vm_only))
        return function
    return register


def _batch_suggestions(batch: int, multiple: int) -> str:
    lower = batch // multiple * multiple
    return " or ".join(str(v) for v in (lower, lower + multiple) if v > 0)


@rule("batch.divisible")
def batch_divisible(ctx: Context) -> Verdict:
    batch, replicas = ctx.cfg.train.global_batch_size, ctx.target.replicas
    if ctx.per_replica_batch is None:
        return fail(f"train.global_batch_size={batch} does not divide across {replicas} replicas",
                    f"train.global_batch_size={_batch_suggestions(batch, replicas)} (a multiple of {replicas})")
    return passed(f"global batch {batch} = {ctx.per_replica_batch} per replica x {replicas}")


@rule("batch.multiple_of_8")
def batch_multiple_of_8(ctx: Context) -> Verdict:
    per_replica = ctx.per_replica_batch
    if per_replica is None:
        return skip("the global batch does not divide (see batch.divisible)")
    if per_replica % SMALL_TILE == 0:
        return passed(f"{per_replica} per replica is a multiple of {SMALL_TILE}")
    padded = math.ceil(per_replica / SMALL_TILE) * SMALL_TILE
    message = f"{per_replica} per replica is not a multiple of {SMALL_TILE}"
    if ctx.target.kind != "tpu":
        return passed(f"{message} (matters on a TPU only)")
    step = SMALL_TILE * ctx.target.replicas
    return warn(f"{message}: XLA pads it to {padded}, {100 * (padded - per_replica) / padded:.0f}% of every step "
                "computes padding",
                f"train.global_batch_size={_batch_suggestions(ctx.cfg.train.global_batch_size, step)}")


@rule("batch.per_core_128")
def batch_per_core_128(ctx: Context) -> Verdict:
    if ctx.target.kind != "tpu":
        return skip(f"applies to a TPU target; this one is {ctx.target.kind.upper()}")
    per_replica = ctx.per_replica_batch
    if per_replica is None:
        return skip("the global batch does not divide (see batch.divisible)")
    if per_replica >= PER_CORE_BATCH:
        return passed(f"{per_replica} per core (>= {PER_CORE_BATCH})")
    return warn(f"{per_replica} per core is under the {PER_CORE_BATCH} the Cloud TPU guide recommends: the MXU idles",
                f"train.global_batch_size={PER_CORE_BATCH * ctx.target.replicas} if it fits in memory (the learning "
                "rate scales with it)")


@rule("model.build")
def model_build(ctx: Context) -> Verdict:
    layers, description, error = ctx.model_or_error
    if error:
        return fail(f"build_model failed: {error}", "fix model.py or the model.* keys")
    if not ctx.feature_layers:
        return warn(f"{description}; no conv or hidden dense layers found to check",
                    "the model rules only know Conv and Dense layers")
    return passed(description)


def _feature_quantum(ctx: Context) -> int:
    return SMALL_TILE if ctx.cfg.train.global_batch_size % BATCH_FOR_SMALL_TILE == 0 else MXU_TILE


def _suggest_widths(widths: list[int], quantum: int) -> str:
    return "[" + ",".join(str(max(quantum, math.ceil(w / quantum) * quantum)) for w in widths) + "]"


@rule("model.feature_dims")
def model_feature_dims(ctx: Context) -> Verdict:
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    if ctx.target.kind != "tpu":
        return skip(f"MXU tiles apply to a TPU target, this one is {ctx.target.kind.upper()} "
                    "(`make doctor CONFIG=configs/tpu.yaml` checks the TPU model)")
    quantum = _feature_quantum(ctx)
    why = (f"the global batch is a multiple of {BATCH_FOR_SMALL_TILE}" if quantum == SMALL_TILE
           else f"the global batch is not a multiple of {BATCH_FOR_SMALL_TILE}")
    odd = [layer for layer in ctx.feature_layers if layer.width % quantum]
    if not odd:
        best = MXU_TILE if all(layer.width % MXU_TILE == 0 for layer in ctx.feature_layers) else quantum
        return passed(f"{len(ctx.feature_layers)} conv/dense layers have widths that are multiples of {best}"
                      + ("" if best == MXU_TILE else f" ({why})"))
    by_width: dict[int, list[str]] = {}
    for layer in odd:
        by_width.setdefault(layer.width, []).append(layer.name)
    listing = "; ".join(f"{width}: {_names(names)}" for width, names in sorted(by_width.items()))
    return warn(f"widths not a multiple of {quantum} ({why}), padded on the MXU: {listing}",
                f"model.widths={_suggest_widths(ctx.cfg.model.widths, quantum)}")


@rule("model.narrow_layers")
def model_narrow_layers(ctx: Context) -> Verdict:
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    if ctx.target.kind != "tpu":
        return skip(f"MXU tiles apply to a TPU target, this one is {ctx.target.kind.upper()} "
                    "(`make doctor CONFIG=configs/tpu.yaml` checks the TPU model)")
    narrow = [layer for layer in ctx.feature_layers if layer.width < MXU_TILE]
    if not narrow:
        return passed(f"every conv/dense layer is at least {MXU_TILE} wide")
    return warn(f"{len(narrow)} layers narrower than {MXU_TILE} use a fraction of the {MXU_TILE}x{MXU_TILE} MXU: "
                f"{_names([f'{layer.name} ({layer.width})' for layer in narrow])}",
                f"model.widths={_suggest_widths(ctx.cfg.model.widths, MXU_TILE)} on a TPU")


@rule("model.hidden_dense")
def model_hidden_dense(ctx: Context) -> Verdict:
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    hidden = [layer for layer in ctx.feature_layers if layer.kind == "dense"]
    if not hidden:
        return skip("no hidden Dense layers (the logits layer is exempt)")
    small = [layer for layer in hidden if layer.width < MIN_HIDDEN_DENSE]
    if not small:
        return passed(f"{len(hidden)} hidden Dense layers, all >= {MIN_HIDDEN_DENSE} units")
    return warn(f"hidden Dense layers under {MIN_HIDDEN_DENSE} units are too small to keep the MXU busy: "
                f"{_names([f'{layer.name} ({layer.width})' for layer in small])}",
                f"widen them to {MIN_HIDDEN_DENSE}+ units, or accept that they run below peak")


@rule("model.batch_norm")
def model_batch_norm(ctx: Context) -> Verdict:
    if ctx.layers is None:
        return skip("the model did not build (see model.build)")
    norms = [layer for layer in ctx.layers if layer.kind == "batch_norm"]
    if not norms:
        return skip("no batch normalization layers")
    per_replica = ctx.per_replica_batch
    if per_replica is None:
        return skip("the global batch does not divide (see batch.divisible)")
    unsynced = [layer for layer in norms if not layer.synchronized]
    if not unsynced:
        return passed(f"{len(norms)} batch-norm layers synchronised across replicas")
    if per_replica >= MIN_BN_BATCH:
        return passed(f"{per_replica} examples per replica for per-replica batch-norm statistics (>= {MIN_BN_BATCH})")
    suggestion = MIN_BN_BATCH * ctx.target.replicas
    return warn(f"{len(unsynced)} batch-norm layers compute statistics over {per_replica} examples per replica "
                f"(under {MIN_BN_BATCH}): noisy, costs accuracy",
                f"train.global_batch_size={suggestion} or model.sync_batch_norm=true")


@rule("model.precision")
def model_precision(ctx: Context) -> Verdict:
    precision = ctx.cfg.runtime.mixed_precision
    if precision == "bfloat16":
        return passed("mixed bfloat16: the MXU's native type, float32 variables")
    if ctx.target.kind == "tpu":
        return warn("float32 on a TPU: the MXU multiplies in bfloat16 passes anyway, activations take twice the "
                    "memory and bandwidth", "runtime.mixed_precision=bfloat16")
    return passed(f"{precision} (on a TPU, bfloat16 is faster)")


@rule("input.static_shapes")
def input_static_shapes(ctx: Context) -> Verdict:
    manifest = ctx.manifest
    if manifest is None:
        return skip("no usable manifest (see data.manifest)")
    if ctx.per_replica_batch is None:
        return skip("the global batch does not divide (see batch.divisible)")
    import tensorflow as tf

    from . import input_pipeline

    cfg, target = ctx.cfg, ctx.target
    pipelines = target.hosts
    shapes, dynamic = [], []
    quiet = logging.getLogger(input_pipeline.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the record-level fallback warning is data.shard_count's business
    try:
        for split, training in (("train", True), ("eval", False)):
            files, examples_per_file = input_pipeline.split_files(cfg.data.dir, manifest, split)
            dataset = input_pipeline.make_dataset(
                files, examples_per_file, manifest["image_size"], ctx.per_replica_batch, training=training,
                pipeline_id=0, num_pipelines=pipelines, replicas_per_pipeline=max(1, target.replicas // pipelines),
                compression=manifest.get("compression", "none"), seed=cfg.runtime.seed,
                shuffle_buffer=cfg.data.shuffle_buffer, global_batch_size=cfg.train.global_batch_size)
            specs = tf.nest.flatten(dataset.element_spec)
            shapes.append(f"{split} " + " ".join(str(spec.shape.as_list()) for spec in specs))
            dynamic += [f"{split} {spec.shape}" for spec in specs if not spec.shape.is_fully_defined()]
    finally:
        quiet.setLevel(level)
    if dynamic:
        return fail(f"input shapes not fully defined: {', '.join(dynamic)}; a TPU compiles one program per shape",
                    "batch with drop_remainder=True and give every tensor a static shape (input_pipeline.py)")
    return passed(f"static shapes: {'; '.join(shapes)}")


@rule("data.manifest")
def data_manifest(ctx: Context) -> Verdict:
    manifest, error, fix = ctx.manifest_or_error
    if manifest is None:
        return fail(error, fix)
    splits = manifest["splits"]
    return passed(f"{ctx.cfg.data.dir}: {splits['train']['num_examples']} train / {splits['eval']['num_examples']} "
                  f"eval examples, {manifest['num_classes']} classes, {manifest['image_size']}px, feature spec "
                  f"v{manifest['feature_spec']['version']}")


def _split_sizes(manifest: dict, split: str) -> tuple[int, int]:
    """(shard files, bytes) of a split."""
    info = manifest["splits"][split]
    return len(info["files"]), int(info.get("bytes", 0))


TOO_SMALL_FIX = ("nothing at this size (harmless for sample data); for real data let `make preprocess` choose: "
                 "~128 MB shards, 10+ per reading host")


def _too_small_for_both(total_bytes: int, hosts: int) -> bool:
    return total_bytes < SHARDS_PER_HOST * hosts * MIN_SHARD_BYTES


@rule("data.shard_count")
def data_shard_count(ctx: Context) -> Verdict:
    if ctx.manifest is None:
        return skip("no usable manifest (see data.manifest)")
    hosts = ctx.target.hosts
    want = SHARDS_PER_HOST * hosts
    train_files, train_bytes = _split_sizes(ctx.manifest, "train")
    eval_files, _ = _split_sizes(ctx.manifest, "eval")
    found = (f"train {train_files} / eval {eval_files} shards for {hosts} reading host{'s' if hosts > 1 else ''}")
    verdicts = []
    if train_files < want:
        if _too_small_for_both(train_bytes, hosts):
            verdicts.append(warn(f"{found}: under {SHARDS_PER_HOST} train shards per host, but the train split is "
                                 f"only {_mb(train_bytes)}, too small for {want} shards of 10 MB+", TOO_SMALL_FIX))
        else:
            verdicts.append(warn(f"{found}: under {SHARDS_PER_HOST} train shards per host",
                                 f"make preprocess PREPROCESS_ARGS='--num_shards {want}'"))
    if eval_files < hosts:
        verdicts.append(warn(f"fewer eval shards than hosts: every host reads all eval files and keeps 1 record "
                             f"in {hosts}", f"at least {hosts} eval shards (preprocess --num_shards)"))
    return worst(*verdicts) if verdicts else passed(f"{found} (>= {SHARDS_PER_HOST} per host)")


@rule("data.shard_size")
def data_shard_size(ctx: Context) -> Verdict:
    if ctx.manifest is None:
        return skip("no usable manifest (see data.manifest)")
    files, total = _split_sizes(ctx.manifest, "train")
    size = total / max(1, files)
    found = f"train shards average {_mb(size)} ({files} file{'s' if files > 1 else ''}, {_mb(total)} in all)"
    if size >= IDEAL_SHARD_BYTES:
        return passed(found)
    if size >= MIN_SHARD_BYTES:
        return passed(f"{found}; 100 MB+ is ideal")
    found = f"{found}: under 10 MB, per-file overhead dominates the reads"
    if _too_small_for_both(total, ctx.target.hosts):
        return warn(f"{found} (the split is too small for 10 shards of 10 MB per host)", TOO_SMALL_FIX)
    fewer = max(ctx.target.hosts * SHARDS_PER_HOST, math.ceil(total / IDEAL_SHARD_BYTES))
    return warn(found, f"fewer, larger shards: make preprocess PREPROCESS_ARGS='--num_shards {fewer}'")


@rule("data.location")
def data_location(ctx: Context) -> Verdict:
    data_dir, hosts = ctx.cfg.data.dir, ctx.target.hosts
    if data_dir.startswith("gs://"):
        return passed(f"{data_dir} is on Cloud Storage")
    if hosts > 1:
        return fail(f"data.dir={data_dir} is a local path but {ctx.target.tpu_type} has {hosts} hosts: the workers "
                    "cannot read this machine's disk",
                    "make preprocess DATA_DIR=gs://BUCKET/... and set data.dir to it")
    return passed(f"{data_dir} is local, read by the one host")


@rule("run.location")
def run_location(ctx: Context) -> Verdict:
    output_dir, hosts = ctx.cfg.runtime.output_dir, ctx.target.hosts
    if output_dir.startswith("gs://") or hosts == 1:
        return passed(f"runtime.output_dir={output_dir}")
    return warn(f"runtime.output_dir={output_dir} is local on a {hosts}-host slice: checkpoints and logs written by "
                "the workers land on their own disks", "runtime.output_dir=gs://BUCKET/runs/...")


@rule("train.steps_per_execution")
def train_steps_per_execution(ctx: Context) -> Verdict:
    spe, history = ctx.cfg.train.steps_per_execution, ctx.history
    step = history.step_seconds
    measured = f"; the run in {ctx.cfg.runtime.output_dir} measured {step * 1000:.1f} ms per step" if step else ""
    if spe == "auto":
        chosen = (f"; its last run chose {history.steps_per_execution}" if history.steps_per_execution else "")
        return passed(f"auto: measured at start-up among 1, 4, 16 ... up to min(log_every, checkpoint_every)"
                      f"{chosen}{measured}")
    if spe == 1:
        return warn("1 step per execution: every step pays a host-device round trip",
                    "train.steps_per_execution=auto (or 32 and more for short steps)")
    if step is not None and step < MIN_STEP_SECONDS and spe < MIN_SPE_FOR_SHORT_STEPS:
        return warn(f"{spe} steps per execution is too small against the measured step time{measured}",
                    f"train.steps_per_execution={MIN_SPE_FOR_SHORT_STEPS} or auto")
    return passed(f"{spe} steps per execution{measured}")


@rule("train.execution_boundaries")
def train_execution_boundaries(ctx: Context) -> Verdict:
    train = ctx.cfg.train
    spe = train.steps_per_execution
    if spe == "auto":
        return passed(f"auto stays within log_every={train.log_every} and checkpoint_every={train.checkpoint_every}")
    verdicts = []
    for key, every in (("log_every", train.log_every), ("checkpoint_every", train.checkpoint_every)):
        what = "logs" if key == "log_every" else "checkpoints"
        if spe > every:
            verdicts.append(warn(f"steps_per_execution={spe} > {key}={every}: {what} happen only at execution "
                                 f"boundaries, every {spe} steps",
                                 f"train.steps_per_execution={every} or less (or auto)"))
        elif every % spe:
            verdicts.append(passed(f"{what} at the first execution boundary after every {every} steps "
                                   f"({spe} does not divide {every})"))
    return worst(*verdicts) if verdicts else passed(
        f"{spe} divides log_every={train.log_every} and checkpoint_every={train.checkpoint_every}")


# The TPU VM rules: functions of injectable paths (tested with temporary files), and their rules.

def device_files(globs: Sequence[str] = DEVICE_GLOBS) -> list[str]:
    return sorted(path for pattern in globs for path in glob.glob(pattern))


def device_holders(devices: Sequence[str], proc_root: str = "/proc") -> tuple[dict[int, str], int]:
    """({pid: command line} of the processes with a device file open, processes not inspectable)."""
    wanted = {os.path.realpath(path) for path in devices}
    holders, hidden = {}, 0
    for fd_dir in glob.glob(os.path.join(proc_root, "[0-9]*", "fd")):
        pid = int(Path(fd_dir).parent.name)
        if pid == os.getpid():
            continue
        try:
            links = [os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)]
        except PermissionError:
            hidden += 1
            continue
        except OSError:  # the process ended
            continue
        if wanted.intersection(links):
            try:
                command = Path(fd_dir).parent.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                command = ""
            holders[pid] = command or "?"
    return holders, hidden


def check_tpu_devices(devices: Sequence[str], expected: int | None) -> Verdict:
    if not devices:
        return fail("no TPU device files (/dev/accel*, /dev/vfio/<n>): TensorFlow will not find a TPU",
                    "check the VM is a TPU VM (make tpu-list) and not in maintenance; TPU_VM=0 if it is not one")
    found = f"{len(devices)} TPU device files ({', '.join(devices[:4])}{', ...' if len(devices) > 4 else ''})"
    if expected and len(devices) != expected:
        return warn(f"{found}, expected {expected} chips per host", "pass --tpu_type to match this VM (make tpu-info)")
    return passed(found)


def check_software(versions: dict[str, str | None], pinned_tf: str | None) -> Verdict:
    """`versions`: installed version (or None) of tensorflow, tensorflow-tpu, libtpu, libtpu-nightly."""
    tf_tpu, tf_plain = versions.get("tensorflow-tpu"), versions.get("tensorflow")
    libtpu = versions.get("libtpu") or versions.get("libtpu-nightly")
    found = ", ".join(f"{name} {version}" for name, version in versions.items() if version) or "none of them"
    if not tf_tpu:
        return fail(f"tensorflow-tpu is not installed ({found})", "make setup (on the TPU VM)")
    if not libtpu:
        return fail(f"libtpu is not installed ({found})", "make setup (on the TPU VM)")
    if tf_plain:
        return fail(f"the plain tensorflow wheel is installed next to tensorflow-tpu ({found})",
                    "remove .venv and run make setup again")
    if pinned_tf and tf_tpu != pinned_tf:
        return warn(f"{found}; requirements.txt pins tensorflow=={pinned_tf}", "make setup")
    return passed(found)


def check_lock_file(lock_path: str = LOCK_FILE, devices: Sequence[str] | None = None,
                    proc_root: str = "/proc") -> Verdict:
    devices = device_files() if devices is None else devices
    holders, hidden = device_holders(devices, proc_root) if devices else ({}, 0)
    held = ", ".join(f"pid {pid} ({command[:60]})" for pid, command in sorted(holders.items()))
    locked = os.path.exists(lock_path)
    if holders:
        return warn(f"the TPU is in use by {held}{' (lock file ' + lock_path + ')' if locked else ''}: a new run "
                    "fails with 'TPU in use' (on a Pod slice the tpu-runtime service holds it on purpose)",
                    "wait for it to finish, or `make tpu-cleanup` to kill it")
    if locked:
        unsure = f" (could not inspect {hidden} processes of other users)" if hidden else ""
        return warn(f"stale lock file {lock_path}: no process holds the TPU{unsure}; the next run may fail with "
                    "'TPU in use'", "make tpu-cleanup")
    return passed("no lock file, no process holds the TPU")


def check_log_dir(log_dir: str | None) -> Verdict:
    path = log_dir or DEFAULT_TPU_LOG_DIR
    source = "TPU_LOG_DIR" if log_dir else "TPU_LOG_DIR unset, libtpu default"
    existing = path
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if os.path.exists(path) and not os.path.isdir(path):
        return warn(f"{source} {path} is not a directory: libtpu's logs are lost",
                    "export TPU_LOG_DIR=/tmp/tpu_logs (make sets it)")
    if not os.access(existing, os.W_OK | os.X_OK):
        return warn(f"{source} {path} is not writable: libtpu's compiler and runtime logs are lost",
                    f"export TPU_LOG_DIR to a writable folder, or fix the permissions of {existing}")
    return passed(f"{source} {path} is writable" + ("" if existing == path else " (created on first use)"))


def _pinned_tensorflow(requirements: Path = REQUIREMENTS) -> str | None:
    try:
        text = requirements.read_text()
    except OSError:
        return None
    match = re.search(r"^tensorflow\s*==\s*([^\s;#]+)", text, re.MULTILINE)
    return match.group(1) if match else None


def installed_versions(names: Sequence[str] = ("tensorflow", "tensorflow-tpu", "libtpu", "libtpu-nightly")) -> dict:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@rule("tpu.devices", tpu_vm_only=True)
def tpu_devices(ctx: Context) -> Verdict:
    expected = None
    if ctx.target.kind == "tpu":
        topo = topology_lib.topology(ctx.target.tpu_type)
        expected = topo.chips // topo.hosts
    return check_tpu_devices(device_files(DEVICE_GLOBS), expected)


@rule("tpu.software", tpu_vm_only=True)
def tpu_software(ctx: Context) -> Verdict:
    return check_software(installed_versions(), _pinned_tensorflow())


@rule("tpu.lock_file", tpu_vm_only=True)
def tpu_lock_file(ctx: Context) -> Verdict:
    return check_lock_file(LOCK_FILE, device_files(DEVICE_GLOBS))


@rule("tpu.log_dir", tpu_vm_only=True)
def tpu_log_dir(ctx: Context) -> Verdict:
    return check_log_dir(os.environ.get("TPU_LOG_DIR"))


# ----------------------------------------------------------------------------- running and reporting

def run_rules(ctx: Context, rules: Sequence[tuple[str, Rule, bool]] | None = None) -> list[Result]:
    results = []
    for name, function, tpu_vm_only in RULES if rules is None else rules:
        if tpu_vm_only and not ctx.on_tpu_vm:
            verdict = skip(NOT_A_TPU_VM)
        else:
            try:
                verdict = function(ctx)
            except UserError as error:
                verdict = fail(str(error), "")
        results.append(Result(verdict.status, name, verdict.message, verdict.fix))
    return results


def format_report(results: Sequence[Result]) -> str:
    width = max(len(result.rule) for result in results)
    lines = []
    for result in results:
        fix = f"  -> fix: {result.fix}" if result.fix and result.status in (WARN, FAIL) else ""
        lines.append(f"{result.status:<4}  {result.rule:<{width}}  {result.message}{fix}")
    return "\n".join(lines)


def summary(results: Sequence[Result]) -> str:
    counts = {status: sum(result.status == status for result in results) for status in (PASS, WARN, FAIL, SKIP)}
    line = f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed, {counts[SKIP]} skipped"
    if counts[FAIL]:
        return f"{line}: fix the FAIL lines before training"
    return f"{line}: ready to train" + (" (see the warnings for speed)" if counts[WARN] else "")


def _keep_tensorflow_off_the_accelerators() -> None:
    """Before TensorFlow is imported: no libtpu (it would take the TPU and its lock from a running
    job), no GPUs. Building the model and the input pipeline needs the CPU only."""
    if "tensorflow" in sys.modules:
        return
    os.environ["TPU_LOAD_LIBRARY"] = "0"
    for name in ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "NEXT_PLUGGABLE_DEVICE_USE_C_API"):
        os.environ.pop(name, None)
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file under configs/")
    parser.add_argument("--tpu_type", help=f"TPU type a TPU target has (default {topology_lib.DEFAULT_TPU_TYPE}; "
                                           "`make doctor` passes TPU_TYPE)")
    parser.add_argument("--target", choices=("auto", "tpu", "gpu", "cpu"), default="auto",
                        help="where the config will train (default: from runtime.strategy and this machine)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. train.global_batch_size=1024")
    args = parser.parse_args(argv)
    cfg = config_lib.load(args.config, args.overrides)
    _keep_tensorflow_off_the_accelerators()
    from . import distribute

    on_tpu_vm = distribute.on_tpu_vm()
    target = resolve_target(cfg, target=args.target, tpu_type=args.tpu_type, on_tpu_vm=on_tpu_vm,
                            gpus=_gpu_count())
    print(f"doctor: {args.config}{' ' + ' '.join(args.overrides) if args.overrides else ''}")
    print(f"target: {target.describe()}")
    print(f"machine: {'a TPU VM' if on_tpu_vm else NOT_A_TPU_VM}", flush=True)
    results = run_rules(Context(cfg, target, on_tpu_vm=on_tpu_vm))
    print(format_report(results))
    print(summary(results))
    return 1 if any(result.status == FAIL for result in results) else 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
