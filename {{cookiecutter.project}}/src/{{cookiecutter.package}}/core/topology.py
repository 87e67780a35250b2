"""What an accelerator type means in hosts and replicas, and how data is spread over hosts,
without importing TensorFlow.

Used to size shards (at least 10 per reading host), to check batch sizes before a TPU is even
created (`make doctor`), to find the TPU chips of a VM, and to pick the config for single- or
multi-host slices. Each of these facts is defined here once and imported everywhere else.
"""

from __future__ import annotations

import glob
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import UserError

# The TPU chips of a VM: /dev/accel<n> (v2-v4, v5p) or /dev/vfio/<n> (v5e, v6e); the shell's copy
# of this pattern is in scripts/tpu_cleanup.sh.
TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")

# Shard sizing: shards of ~128 MB read efficiently from GCS; below 10 MB per-file overhead
# dominates; 10 shards per reading host let every host interleave several files at once.
TARGET_SHARD_BYTES = 128 * 2**20
IDEAL_SHARD_BYTES = 100 * 2**20
MIN_SHARD_BYTES = 10 * 2**20
SHARDS_PER_HOST = 10

# The TPU type this project was generated for; `make ... TPU_TYPE=...` overrides it.
DEFAULT_TPU_TYPE = "{{ cookiecutter.tpu_type }}"


@dataclass(frozen=True)
class Target:
    """Where a run happens: the one description used by the strategy (`distribute.resolve`), the
    TPU type table below and `make doctor`."""

    kind: str
    """'tpu', 'gpu' or 'cpu'."""
    replicas: int
    """Devices TensorFlow sees, one replica each: v4 and v5p chips are one megacore device,
    v2/v3 chips are two TensorCores, v5e and v6e chips have one TensorCore."""
    hosts: int
    why: str = ""
    """How it was decided (e.g. 'runtime.strategy=auto on a TPU VM')."""
    tpu_type: str = ""
    chips: int = 0
    strategy: Any = field(default=None, compare=False, repr=False)
    """The tf.distribute strategy, once `distribute.resolve` has created it."""

    def per_replica_batch_size(self, global_batch_size: int) -> int:
        """The global batch split across replicas; it must divide evenly."""
        if global_batch_size % self.replicas:
            lower = global_batch_size // self.replicas * self.replicas
            suggestions = " or ".join(str(v) for v in (lower, lower + self.replicas) if v > 0)
            raise UserError(
                f"train.global_batch_size={global_batch_size} does not divide across {self.replicas} "
                f"replicas; use a multiple of {self.replicas}, e.g. {suggestions}"
            )
        return global_batch_size // self.replicas

    def describe(self) -> str:
        what = f"TPU {self.tpu_type}" if self.kind == "tpu" and self.tpu_type else self.kind.upper()
        where = (
            f"{what}, {self.replicas} replica{'s' if self.replicas > 1 else ''}, {self.hosts} "
            f"host{'s' if self.hosts > 1 else ''}"
        )
        if self.strategy is not None:
            return f"strategy: {type(self.strategy).__name__} on {where}"
        return f"{where} ({self.why})" if self.why else where


@dataclass(frozen=True)
class Chip:
    """One TPU chip of a generation, as its Cloud TPU page gives it."""

    hbm_bytes: int
    peak_bf16_flops: float
    """Peak bfloat16 FLOP/s of the chip (all its TensorCores)."""
    replicas: int
    """Replicas (TensorFlow devices) per chip: v2/v3 chips are two TensorCores, two devices."""
    source: str

    @property
    def replica_hbm_bytes(self) -> int:
        return self.hbm_bytes // self.replicas


# From cloud.google.com/tpu/docs/<generation> ("HBM capacity per chip", "Peak compute per chip
# (bf16)") and /tpu/docs/system-architecture-tpu-vm; the pages give v2-v4 in GiB, v5e-v6e in GB.
CHIPS = {
    "v2": Chip(16 * 2**30, 45e12, 2, "cloud.google.com/tpu/docs/system-architecture-tpu-vm"),
    "v3": Chip(32 * 2**30, 123e12, 2, "cloud.google.com/tpu/docs/system-architecture-tpu-vm"),
    "v4": Chip(32 * 2**30, 275e12, 1, "cloud.google.com/tpu/docs/v4"),
    "v5litepod": Chip(16 * 10**9, 197e12, 1, "cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip(95 * 10**9, 459e12, 1, "cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip(32 * 10**9, 918e12, 1, "cloud.google.com/tpu/docs/v6e"),
}


def chip(tpu_type: str) -> Chip:
    """The chip of a TPU type, e.g. v5litepod-16 -> v5e's."""
    generation = tpu_type.split("-")[0]
    if generation not in CHIPS:
        raise ValueError(f"unknown TPU type {tpu_type!r}; expected e.g. v4-8, v5litepod-16, v6e-8")
    return CHIPS[generation]


def chips_of(tpu_type: str, replicas: int) -> int:
    """TPU chips holding `replicas` devices of `tpu_type`'s generation (0 when it is unknown)."""
    generation = tpu_type.split("-")[0]
    return max(1, replicas // CHIPS[generation].replicas) if generation in CHIPS else 0


def topology(tpu_type: str = DEFAULT_TPU_TYPE) -> Target:
    """The TPU `tpu_type` (e.g. v4-32) as chips, hosts and replicas."""
    match = re.fullmatch(r"(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)", tpu_type)
    if not match:
        raise ValueError(f"unknown TPU type {tpu_type!r}; expected e.g. v4-8, v5litepod-16, v6e-8")
    generation, size = match.group(1), int(match.group(2))
    if generation in ("v2", "v3"):  # size counts TensorCores; 8 per host, 2 per chip
        return Target("tpu", size, max(1, size // 8), tpu_type=tpu_type, chips=size // 2)
    if generation in ("v4", "v5p"):  # size counts TensorCores; 2 per chip (one megacore device)
        chips = max(1, size // 2)
        return Target("tpu", chips, max(1, chips // 4), tpu_type=tpu_type, chips=chips)
    # v5e and v6e count chips: up to 8 on one host, 4 per host in multi-host slices.
    return Target("tpu", size, 1 if size <= 8 else size // 4, tpu_type=tpu_type, chips=size)


# The chips of a slice as its physical grid: what Vertex AI's `tpu_topology` and GKE's
# `cloud.google.com/gke-tpu-topology` name. v5e and v6e are 2D tori, v4 and v5p 3D
# (cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus#configuration).
TOPOLOGIES = {
    "2d": {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
    "3d": {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8", 512: "8x8x8"},
}


def slice_topology(tpu_type: str) -> str:
    """The chip grid of `tpu_type`, e.g. v5litepod-8 -> '2x4', v4-8 -> '2x2x1'."""
    target = topology(tpu_type)
    generation = tpu_type.split("-")[0]
    if generation in ("v2", "v3"):
        raise ValueError(f"{tpu_type}: v2 and v3 slices have no topology label; use v4, v5litepod, v5p or v6e")
    grid = TOPOLOGIES["3d" if generation in ("v4", "v5p") else "2d"].get(target.chips)
    if grid is None:
        raise ValueError(f"{tpu_type}: {target.chips} chips is not a slice shape of {generation}")
    return grid


def tpu_device_files(globs=TPU_DEVICE_GLOBS) -> list[str]:
    """The TPU device files of this machine (empty off a TPU VM)."""
    return sorted(path for pattern in globs for path in glob.glob(pattern))


def choose_num_shards(num_examples: int, bytes_per_example: int, reading_hosts: int) -> int:
    """Shards of ~128 MB, and at least 10 per reading host when the data is big enough that
    those shards still hold 10 MB or more."""
    total_bytes = num_examples * bytes_per_example
    by_size = math.ceil(total_bytes / TARGET_SHARD_BYTES)
    by_hosts = min(SHARDS_PER_HOST * reading_hosts, total_bytes // MIN_SHARD_BYTES)
    return max(1, by_size, by_hosts)
