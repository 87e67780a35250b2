"""The engine of `make doctor`: verdicts, the facts the rules look at (target, manifest, model,
last run), the rule registry, running the rules and the report. The rules live in one module per
topic beside this one; the task adds its own (tasks/<name>/doctor_rules.py).
"""

from __future__ import annotations

import functools
import glob
import math
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..core import config as config_lib
from .. import tasks
from ..core import support
from ..core import topology as topology_lib
from ..core.topology import Target
from ..core.errors import UserError

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
PREEMPTION_GRACE_SECONDS = 30  # from a Spot TPU VM's SIGTERM to its hard stop

LOCK_FILE = "/tmp/libtpu_lockfile"
DEFAULT_TPU_LOG_DIR = "/tmp/tpu_logs"  # tpu.mk's default, and libtpu's
REQUIREMENTS = Path(__file__).resolve().parents[3] / "requirements.txt"


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


def not_on_a_tpu(ctx: "Context", applies: str, checks: str) -> Verdict | None:
    """SKIP for a rule about the TPU when the target is another one, with the command that checks
    the TPU config; None on a TPU target."""
    if ctx.target.kind == "tpu":
        return None
    return skip(
        f"{applies} to a TPU target, this one is {ctx.target.kind.upper()} "
        f"(`make doctor CONFIG={config_lib.shipped_config(ctx.task.name, 'tpu', registry=tasks)}` {checks})"
    )


def worst(*verdicts: Verdict) -> Verdict:
    """The most severe of several verdicts of one rule, their messages and fixes joined."""
    order = (SKIP, PASS, WARN, FAIL)
    status = max((v.status for v in verdicts), key=order.index)
    return Verdict(
        status, "; ".join(v.message for v in verdicts if v.message), "; ".join(v.fix for v in verdicts if v.fix)
    )


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} layers)" if len(names) > limit else "")


def _mb(size: float) -> str:
    return f"{size / 2**20:.1f} MB" if size < 10 * 2**20 else f"{size / 2**20:.0f} MB"


# ----------------------------------------------------------------------------- what is checked


def gpu_count() -> int:
    return len(glob.glob("/dev/nvidia[0-9]*"))


def resolve_target(
    cfg: config_lib.Config, *, target: str = "auto", tpu_type: str | None = None, on_tpu_vm: bool = False, gpus: int = 0
) -> Target:
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
        generation = support.GENERATIONS.get(name.split("-")[0])
        if generation is not None and not generation.tensorflow:
            raise UserError(f"--tpu_type {name}: {generation.evidence}; train TensorFlow on v5p, v5e or v4")
        try:
            topo = topology_lib.topology(name)
        except ValueError as error:
            raise UserError(f"--tpu_type: {error}") from None
        source = "--tpu_type" if tpu_type else "the project's TPU type"
        return dataclasses.replace(topo, why=f"{why}; topology of {source}")
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


def model_layers(model, task) -> list[LayerInfo]:
    """The conv, dense and batch-norm layers of a Keras model of `task`, nested models included."""
    from ..core.keras import keras

    outputs = set(task.output_layers(model))
    found = []

    def visit(layer):
        for inner in getattr(layer, "layers", None) or []:
            visit(inner)
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(
                LayerInfo(layer.name, "batch_norm", 0, synchronized=bool(getattr(layer, "synchronized", False)))
            )
        elif isinstance(layer, keras.layers.Dense):
            found.append(LayerInfo(layer.name, "dense", int(layer.units), layer.name in outputs))
        elif isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)) and getattr(
            layer, "filters", None
        ):
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
    checkpoint_save_seconds: float | None = None
    goodput: dict | None = None
    """The goodput record over every start of the run (goodput.py), if it has one."""
    metrics: dict = field(default_factory=dict)
    """The whole metrics.json: the last evaluation, the baselines it was judged against, ..."""

    @property
    def step_seconds(self) -> float | None:
        if self.examples_per_second and self.global_batch_size and math.isfinite(self.examples_per_second):
            return self.global_batch_size / self.examples_per_second
        return None


def read_run_history(output_dir: str) -> RunHistory:
    import tensorflow as tf
    import yaml

    from ..core import run_dir

    def read_config():
        path = run_dir.run_path(output_dir, "config.yaml")
        try:
            if not tf.io.gfile.exists(path):
                return None
            with tf.io.gfile.GFile(path) as handle:
                return yaml.safe_load(handle)
        except (tf.errors.OpError, ValueError, yaml.YAMLError):
            return None

    run_config = read_config() or {}
    try:  # the run record's one reader; a record that cannot be read is no history, not a failed check
        metrics = run_dir.RunRecord(output_dir).values
    except UserError:
        metrics = {}
    train = run_config.get("train", {}) if isinstance(run_config, dict) else {}
    spe = train.get("steps_per_execution")
    metrics = metrics if isinstance(metrics, dict) else {}
    eps, save = metrics.get("examples_per_second"), metrics.get("checkpoint_save_seconds")
    record = metrics.get("goodput")
    return RunHistory(
        spe if isinstance(spe, int) else None,
        train.get("global_batch_size"),
        float(eps) if isinstance(eps, (int, float)) else None,
        float(save) if isinstance(save, (int, float)) else None,
        record if isinstance(record, dict) and isinstance(record.get("phase_seconds"), dict) else None,
        metrics,
    )


class Context:
    """The facts the rules look at, each computed once, on first use."""

    def __init__(
        self, cfg: config_lib.Config, task, target: Target, *, on_tpu_vm: bool = False, tpu_type: str | None = None
    ):
        self.cfg, self.task, self.target, self.on_tpu_vm = cfg, task, target, on_tpu_vm
        self.tpu_type = tpu_type or target.tpu_type or topology_lib.DEFAULT_TPU_TYPE
        """The TPU type the project trains on (--tpu_type), whatever this run's target."""
        self.credentials: str | None = None
        """Whose Google Cloud credentials read the config's gs:// paths (None: none needed, or none here)."""
        self.no_credentials = ""
        """Why the config's gs:// paths cannot be read here (gcp.require_credentials' one line); empty
        when they can or there are none."""

    def unreadable(self, path: str) -> bool:
        """Whether `path` is on Cloud Storage and this machine has no credentials to read it: the
        rules that would read it skip."""
        return bool(self.no_credentials) and path.startswith("gs://")

    @property
    def per_replica_batch(self) -> int | None:
        """The per-replica batch, or None when the global batch does not divide."""
        batch, replicas = self.cfg.train.global_batch_size, self.target.replicas
        return None if batch % replicas else batch // replicas

    @functools.cached_property
    def manifest_or_error(self) -> tuple[dict | None, str, str]:
        """(the checked manifest or None, what is wrong, the fix)."""
        import tensorflow as tf

        from ..core import input_pipeline

        data_dir = self.cfg.data.dir
        if self.unreadable(data_dir):
            return None, f"{data_dir}: not read, no Google Cloud credentials here (see data.credentials)", ""
        try:
            return input_pipeline.read_manifest(data_dir, self.task, self.cfg.data), "", ""
        except UserError as error:  # its message says what is wrong; then, after "; ", the fix
            message, _, fix = str(error).partition("; ")
            return None, message, fix or f"re-run `make preprocess` (DATA_DIR={data_dir})"
        except tf.errors.OpError as error:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return (
                None,
                f"cannot read {data_dir}/manifest.json: {detail}",
                (
                    "check data.dir and your access to it (gcloud auth application-default login; on a TPU VM the "
                    "service account needs read access to the bucket)"
                ),
            )
        except (KeyError, TypeError, AttributeError) as error:
            return (
                None,
                f"{data_dir}/manifest.json lacks an expected field ({type(error).__name__}: {error})",
                (f"re-run `make preprocess` (DATA_DIR={data_dir})"),
            )

    @property
    def manifest(self) -> dict | None:
        return self.manifest_or_error[0]

    @property
    def precision(self) -> str:
        """The precision the run would train in on the target ('bfloat16' or 'float32')."""
        from ..core import precision

        return precision.choose(self.cfg.runtime.mixed_precision, self.target.kind).precision

    @functools.cached_property
    def planner(self):
        """The memory planner of the config's model (core/memory.py): built from shapes, so a model of
        any size costs this host no memory."""
        from ..core import memory

        return memory.Planner(self.cfg, self.task, self.manifest or self.task.nominal_manifest(self.cfg.data))

    @functools.cached_property
    def model_or_error(self) -> tuple[list[LayerInfo] | None, str, str | None]:
        """(the model's layers, a one-line description, the error when it does not build)."""
        try:
            model = self.planner.model(precision_name=self.precision)
        except Exception as error:  # noqa: BLE001 - a user's model may fail in any way; report it
            first_line = (str(error).strip().splitlines() or [""])[0]
            return None, "", f"{type(error).__name__}: {first_line}"
        layers = model_layers(model, self.task)
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
        if self.unreadable(self.cfg.runtime.output_dir):
            return RunHistory()  # not read: see data.credentials
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


# ----------------------------------------------------------------------------- running and reporting


def task_rules(task) -> list[tuple[str, Rule, bool]]:
    """`task`'s own rules (tasks/<name>/doctor_rules.py): pure functions of (config, target,
    manifest) returning (status, message, fix)."""

    def adapt(function) -> Rule:
        def run(ctx: Context) -> Verdict:
            status, message, fix = function(ctx.cfg, ctx.target, ctx.manifest)
            return Verdict(status.upper(), message, fix)

        return run

    return [(name, adapt(function), False) for name, function in task.doctor_rules()]


def run_rules(ctx: Context, rules: Sequence[tuple[str, Rule, bool]] | None = None) -> list[Result]:
    results = []
    for name, function, tpu_vm_only in [*RULES, *task_rules(ctx.task)] if rules is None else rules:
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
