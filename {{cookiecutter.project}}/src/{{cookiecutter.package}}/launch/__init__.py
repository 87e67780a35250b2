"""Training launched where teams run it besides a TPU VM they created themselves: a Vertex AI custom
job (`make vertex-train`, launch/vertex.py) or a GKE TPU slice (`make gke-manifest`, launch/gke.py).

Both run one container image, built from the project's Dockerfile with the TPU build of TensorFlow
(`make image`), and one command: `python -m <package>.train --config FILE key=value ...`, the same
entry point as `make train`. A job runs on machines that see neither this machine's disk nor its
`data/`: its data and its run directory must be gs:// paths, which `remote_paths` checks.
"""

from __future__ import annotations

import os
from typing import Sequence

from .. import tasks
from ..core.config import Config, load
from ..core.errors import UserError

PACKAGE = "{{ cookiecutter.package }}"
PROJECT = "{{ cookiecutter.project }}"
# The image's name in the Artifact Registry repository named after the project.
IMAGE_NAME = "train"
# Where the Dockerfile puts the project inside the image: the job's working directory, so config
# paths such as configs/tpu.yaml mean the same there as here.
WORKDIR = "/app"


def image_uri(gcp_project: str, region: str, tag: str = "latest") -> str:
    """The Artifact Registry address `make image` pushes to, e.g.
    us-central1-docker.pkg.dev/my-project/tpu-trainer/train:latest."""
    return f"{region}-docker.pkg.dev/{gcp_project}/{PROJECT}/{IMAGE_NAME}:{tag}"


def image_path(config_path: str) -> str:
    """`config_path` as the image sees it: relative to the project, which the image holds in /app."""
    relative = os.path.relpath(os.path.abspath(config_path))
    if relative.startswith(os.pardir) or not os.path.isfile(relative):
        raise UserError(
            f"CONFIG={config_path} is not a file of this project, which is all the image holds: "
            "put it under configs/ and rebuild the image (make image)"
        )
    return relative


def train_command(config_path: str, overrides: Sequence[str] = ()) -> list[str]:
    """The container's command: the project's own training entry point, with the config as the
    image holds it."""
    return ["python", "-m", f"{PACKAGE}.train", "--config", image_path(config_path), *overrides]


def load_config(config_path: str, overrides: Sequence[str] = ()) -> Config:
    return load(config_path, overrides, registry=tasks)


def remote_paths(config: Config, where: str) -> dict[str, str]:
    """data.dir and runtime.output_dir of `config`, refused in one line unless both are gs:// paths."""
    paths = {"data.dir": config.data.dir, "runtime.output_dir": config.runtime.output_dir}
    for key, value in paths.items():
        if not str(value).startswith("gs://"):
            raise UserError(
                f"{key}={value} is a path on this machine, which a {where} cannot read: pass "
                f"{key}=gs://BUCKET/... (make preprocess DATA_DIR=gs://... writes the data there)"
            )
    return paths
