"""Which TensorFlow is known to run on which TPU, and the public source of each claim: the support
matrix that README.md ("Which TPU, which TensorFlow") shows and `make doctor` checks (tpu.support).

TensorFlow on TPUs is at its end of line: tensorflow-tpu 2.20.0 (August 2025) is the last release,
the TPU nightlies stopped in December 2025, and Keras' maintainers pin tensorflow-tpu 2.19.1 as
"the last version of the TensorFlow that supports TPUs". Google's own TensorFlow-on-TPU tests stayed
at 2.18. No public source shows 2.20 on a TPU, which is why requirements.txt makes 2.19 a TPU VM's
default set. Nothing in this project has run on a TPU: its tests run both sets on CPUs.

A claim here is what a public source shows, not a guarantee; `make doctor` WARNs where none does.
"""

from __future__ import annotations

from dataclasses import dataclass

# The sources, by key. Each claim below names the keys it rests on.
SOURCES = {
    "keras": "keras-team/keras#21974, requirements-tensorflow-tpu.txt: '2.19.1 is the last version of the "
    "TensorFlow that supports TPUs' (tensorflow-tpu==2.19.1)",
    "ml-auto-solutions": "GoogleCloudPlatform/ml-auto-solutions, dags/solutions_team/"
    "solutionsteam_tf_release_supported.py: Google's TensorFlow release tests, TF 2.18 on v4-8, v4-32, "
    "v5e-4, v5e-16, v5p-8, v5p-32",
    "v5e-training": "cloud.google.com/tpu/docs/v5e-training: TensorFlow on v5e with the tpu-vm-tf-2.17.1-pjrt "
    "and -pod-pjrt runtimes",
    "vertex": "cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm: 'TPU v5e supports ... TensorFlow "
    "2.15+'; 'Starting with TPU v6e, TensorFlow isn't supported for training'",
    "gke-sample": "github.com/SinaChavoshi/GKESamples, tf2.19_on_tpu: an experimental tensorflow_tpu 2.19.0 "
    "wheel on a v6e 4x4 slice (v6e-16), a personal sample",
    "tpu7x": "cloud.google.com/tpu/docs/tpu7x: 'You can use the JAX and PyTorch frameworks on TPU7x. "
    "TensorFlow is not supported.'",
    "runtimes": "cloud.google.com/tpu/docs/runtimes: base images per generation; the newest TensorFlow "
    "image listed is 2.18.0",
    "pypi": "pypi.org/project/tensorflow-tpu: 2.20.0 (2025-08-13) is the newest release; tf-nightly-tpu "
    "stopped at 2.21.0.dev20251208",
}

# The newest TensorFlow that a maintainer names as supporting TPUs (SOURCES["keras"]).
LAST_TPU_TENSORFLOW = "2.19"
# The newest TensorFlow with a documented tpu-vm-tf-*-pod-pjrt image, which a Pod slice's workers
# run (SOURCES["runtimes"]).
NEWEST_POD_IMAGE = "2.18.0"


@dataclass(frozen=True)
class Generation:
    name: str
    """The generation as Google's pages name it (v5e for v5litepod-N)."""
    runtime: str
    """The single-host TPU VM image (tpu.mk's RUNTIME_<generation>); `make setup` adds TensorFlow."""
    shown: str
    """The newest TensorFlow minor version a public source shows training on it ('' if none)."""
    evidence: str
    """What the sources show, in a few words."""
    sources: tuple[str, ...]
    tensorflow: bool = True
    """False where the vendor says TensorFlow does not run at all."""


GENERATIONS = {
    "v4": Generation(
        "v4",
        "tpu-ubuntu2204-base",
        "2.18",
        "Google's TF release tests ran TF 2.18 on v4-8 and v4-32",
        ("ml-auto-solutions", "runtimes"),
    ),
    "v5litepod": Generation(
        "v5e",
        "v2-alpha-tpuv5-lite",
        "2.18",
        "Google's TF release tests ran TF 2.18 on v5e-4 and v5e-16; Google documents TF 2.17.1 images; "
        "Vertex AI lists TF 2.15+",
        ("ml-auto-solutions", "v5e-training", "vertex"),
    ),
    "v5p": Generation(
        "v5p",
        "v2-alpha-tpuv5",
        "2.18",
        "Google's TF release tests ran TF 2.18 on v5p-8 and v5p-32",
        ("ml-auto-solutions", "runtimes"),
    ),
    "v6e": Generation(
        "v6e",
        "v2-alpha-tpuv6e",
        "",
        "no Google source shows TF on v6e (Vertex AI: no TF training from v6e on); a personal GKE sample ran "
        "an experimental TF 2.19.0 wheel on v6e-16",
        ("vertex", "gke-sample"),
    ),
    "tpu7x": Generation("TPU7x", "", "", "Google: TensorFlow is not supported on TPU7x", ("tpu7x",), tensorflow=False),
}


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])


@dataclass(frozen=True)
class Finding:
    supported: bool
    """False where no public source supports this TensorFlow on this TPU type (doctor WARNs)."""
    message: str
    fix: str = ""


def check(tpu_type: str, tensorflow: str, hosts: int = 1) -> Finding:
    """What the sources say of TensorFlow `tensorflow` (e.g. '2.19.1') on `tpu_type` with `hosts` hosts."""
    generation = GENERATIONS.get(tpu_type.split("-")[0])
    if generation is None:
        return Finding(False, f"{tpu_type}: no record of TensorFlow on this TPU type", "pick one of " + types())
    line = f"TF {tensorflow} on {tpu_type} ({generation.name})"
    if not generation.tensorflow:
        return Finding(
            False,
            f"{line}: {generation.evidence} [{', '.join(generation.sources)}]",
            "train TensorFlow on v5p, v5e or v4; TPU7x runs JAX and PyTorch",
        )
    sources = ", ".join((*generation.sources, "keras"))
    known = f"{generation.evidence}; Keras names 2.19.1 the last TF that supports TPUs [{sources}]"
    if not generation.shown:
        return Finding(
            False,
            f"{line}: {known}",
            "expect to debug TensorFlow on it yourself, or pick v5p-8, v5litepod-8 or v4-8, whose "
            "generations Google's TF tests covered",
        )
    ceiling = max(generation.shown, LAST_TPU_TENSORFLOW, key=_minor)
    if _minor(tensorflow) > _minor(ceiling):
        return Finding(
            False,
            f"{line}: newer than any TF a source shows on TPUs ({known})",
            f"make setup TF={LAST_TPU_TENSORFLOW} (the TPU VM default set)",
        )
    if hosts > 1 and _minor(tensorflow) > _minor(NEWEST_POD_IMAGE):
        return Finding(
            False,
            f"{line}, {hosts} hosts: the workers run the tpu-vm-tf-{tensorflow}-pod-pjrt image, and the newest "
            f"TF Pod image Google documents is tpu-vm-tf-{NEWEST_POD_IMAGE}-pod-pjrt [runtimes]",
            "make tpu-versions lists the zone's images; if it lacks this one, use a single-host type or add a "
            "TF set of a listed Pod image's version to requirements.txt",
        )
    return Finding(True, f"{line}: {known}; not run on a TPU by this project")


def types() -> str:
    return ", ".join(f"{key}-N" for key, generation in GENERATIONS.items() if generation.tensorflow)
