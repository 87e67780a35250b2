"""What an accelerator type means in hosts and replicas, without importing TensorFlow.

Used to size shards (at least 10 per reading host), to check batch sizes before a TPU is even
created (`make doctor`), and to pick the config for single- or multi-host slices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The TPU type this project was generated for; `make ... TPU_TYPE=...` overrides it.
DEFAULT_TPU_TYPE = "{{ cookiecutter.tpu_type }}"


@dataclass(frozen=True)
class Topology:
    tpu_type: str
    chips: int
    hosts: int
    replicas: int
    """TPU devices TensorFlow sees, one replica each: v4 and v5p chips are one megacore device,
    v2/v3 chips are two TensorCores, v5e and v6e chips have one TensorCore."""


def topology(tpu_type: str = DEFAULT_TPU_TYPE) -> Topology:
    match = re.fullmatch(r"(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)", tpu_type)
    if not match:
        raise ValueError(f"unknown TPU type {tpu_type!r}; expected e.g. v4-8, v5litepod-16, v6e-8")
    generation, size = match.group(1), int(match.group(2))
    if generation in ("v2", "v3"):  # size counts TensorCores; 8 per host, 2 per chip
        return Topology(tpu_type, size // 2, max(1, size // 8), size)
    if generation in ("v4", "v5p"):  # size counts TensorCores; 2 per chip (one megacore device)
        chips = max(1, size // 2)
        return Topology(tpu_type, chips, max(1, chips // 4), chips)
    # v5e and v6e count chips: up to 8 on one host, 4 per host in multi-host slices.
    return Topology(tpu_type, size, 1 if size <= 8 else size // 4, size)
