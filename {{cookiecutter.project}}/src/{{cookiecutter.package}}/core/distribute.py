"""Resolves the distribution strategy: the one place that decides where training runs.

`runtime.strategy=auto` picks a TPU if this is a TPU VM (or `runtime.tpu` names a Pod slice),
else every GPU with MirroredStrategy, else the CPU split into `runtime.cpu_devices` logical
devices under MirroredStrategy. The last case is not a toy: it runs the same per-replica
batching, input sharding, metric reduction and steps_per_execution as a TPU, so CPU tests catch
the bugs that would otherwise first appear on a TPU.
"""

from __future__ import annotations

import functools
import logging
import os

import tensorflow as tf

from . import native_logs, topology
from .topology import Target
from .config import RuntimeConfig
from .errors import UserError

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def physical_devices() -> tuple:
    """TensorFlow's first look at the machine's devices, once per process. On a machine without an
    NVIDIA driver, the CUDA probe's error line is left out of stderr (native_logs.NO_GPU_PROBE);
    every other line it writes still shows, and on a GPU machine nothing is left out."""
    if native_logs.has_nvidia_driver():
        return tuple(tf.config.list_physical_devices())
    with native_logs.without_lines(native_logs.NO_GPU_PROBE):
        return tuple(tf.config.list_physical_devices())


def devices_of(kind: str) -> list:
    """The physical devices of `kind` ("CPU", "GPU", "TPU")."""
    return [device for device in physical_devices() if device.device_type == kind]


def on_tpu_vm() -> bool:
    return bool(topology.tpu_device_files()) or os.environ.get("TPU_VM") == "1"


_tpu_system: dict = {}
"""The TPU's cluster resolver and topology, once initialised (for `one_tpu_core`)."""


def one_tpu_core() -> tf.distribute.TPUStrategy:
    """A TPUStrategy over one TPU core of the initialised system (make parity's one-device side)."""
    assignment = tf.tpu.experimental.DeviceAssignment.build(_tpu_system["topology"], num_replicas=1)
    return tf.distribute.TPUStrategy(_tpu_system["resolver"], experimental_device_assignment=assignment)


def _tpu(runtime: RuntimeConfig) -> Target:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=runtime.tpu)
        if runtime.tpu not in ("local", ""):
            tf.config.experimental_connect_to_cluster(resolver)
        _tpu_system.update(resolver=resolver, topology=tf.tpu.experimental.initialize_tpu_system(resolver))
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, OSError, tf.errors.OpError) as error:
        # OSError: a named TPU is looked up through the GCE metadata server, absent off Google Cloud.
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0][:160]
        raise UserError(
            f"runtime.strategy=tpu but no TPU could be initialised (runtime.tpu={runtime.tpu!r}: {detail}); "
            "run on a TPU VM after `make setup`, check runtime.tpu (local, or the Pod slice's name), "
            "or use runtime.strategy=auto"
        ) from None
    hosts = strategy.extended.num_hosts
    # The TPU type (its generation sets the chip's HBM and peak): the VM's, else the project's.
    tpu_type = os.environ.get("TPU_ACCELERATOR_TYPE") or topology.DEFAULT_TPU_TYPE
    return Target(
        "tpu",
        strategy.num_replicas_in_sync,
        hosts,
        f"runtime.tpu={runtime.tpu}",
        tpu_type=tpu_type,
        chips=topology.chips_of(tpu_type, strategy.num_replicas_in_sync),
        strategy=strategy,
    )


@functools.lru_cache(maxsize=None)
def _mirrored(devices: tuple[str, ...]) -> tf.distribute.MirroredStrategy:
    """One MirroredStrategy per device set and process. Each strategy numbers its collective ops
    from the same start, and TensorFlow caches a collective's shape by that number: a second
    strategy over the same devices (a second run in one process, as in tests) would collide with
    the first one's shapes."""
    return tf.distribute.MirroredStrategy(list(devices))


def _gpu() -> Target:
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        raise UserError(
            "runtime.strategy=gpu but TensorFlow sees no GPU; check the CUDA install "
            "(nvidia-smi) or use runtime.strategy=auto"
        )
    strategy = _mirrored(tuple(d.name for d in gpus))
    return Target("gpu", strategy.num_replicas_in_sync, 1, strategy=strategy)


def split_cpu(devices: int) -> None:
    """Splits the host CPU into `devices` logical devices; must run before TensorFlow starts."""
    cpus = devices_of("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if current is not None and len(current) == devices:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(devices)]
        )
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        raise UserError(
            f"runtime.cpu_devices={devices} but TensorFlow already started with {have} CPU "
            "devices in this process; resolve the strategy before other TensorFlow work"
        ) from None


def _cpu(runtime: RuntimeConfig) -> Target:
    split_cpu(runtime.cpu_devices)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][: runtime.cpu_devices]
    if len(devices) == 1:
        strategy = tf.distribute.OneDeviceStrategy(devices[0])
    else:
        strategy = _mirrored(tuple(devices))
    return Target("cpu", strategy.num_replicas_in_sync, 1, strategy=strategy)


def resolve(runtime: RuntimeConfig) -> Target:
    """The strategy `runtime.strategy` asks for; logs what was found and chosen."""
    physical_devices()  # TensorFlow's first look at the devices, here whatever is asked for
    wanted = runtime.strategy
    if wanted == "auto":
        if on_tpu_vm() or runtime.tpu not in ("local", ""):
            wanted = "tpu"
        elif devices_of("GPU"):
            wanted = "gpu"
        else:
            wanted = "cpu"
        log.info("runtime.strategy=auto: found %s", {"tpu": "a TPU", "gpu": "GPUs", "cpu": "no accelerator"}[wanted])
    resolved = {"tpu": lambda: _tpu(runtime), "gpu": _gpu, "cpu": lambda: _cpu(runtime)}[wanted]()
    native_logs.spend_onednn_notice()  # TensorFlow has started: no training graph logs the notice now
    log.info(resolved.describe())
    return resolved
