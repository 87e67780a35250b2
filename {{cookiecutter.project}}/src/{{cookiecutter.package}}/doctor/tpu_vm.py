"""`make doctor` rules: the TensorFlow the TPU type runs, against the sources (anywhere); the TPU VM
itself (TPU VM troubleshooting; SKIP anywhere else)."""

from __future__ import annotations

import glob
import importlib.metadata
import os
from pathlib import Path
from typing import Sequence

from ..core import support, tensorflow_sets
from .engine import (
    DEFAULT_TPU_LOG_DIR,
    LOCK_FILE,
    REQUIREMENTS,
    Context,
    Verdict,
    fail,
    passed,
    rule,
    topology_lib,
    warn,
)

# The TPU VM rules: functions of injectable paths (tested with temporary files), and their rules.


def device_files(globs: Sequence[str] | None = None) -> list[str]:
    return topology_lib.tpu_device_files(globs or topology_lib.TPU_DEVICE_GLOBS)


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
        return fail(
            "no TPU device files (/dev/accel*, /dev/vfio/<n>): TensorFlow will not find a TPU",
            "check the VM is a TPU VM (make tpu-list) and not in maintenance; TPU_VM=0 if it is not one",
        )
    found = f"{len(devices)} TPU device files ({', '.join(devices[:4])}{', ...' if len(devices) > 4 else ''})"
    if expected and len(devices) != expected:
        return warn(f"{found}, expected {expected} chips per host", "pass --tpu_type to match this VM (make tpu-info)")
    return passed(found)


def check_software(versions: dict[str, str | None], pinned: Sequence[str]) -> Verdict:
    """`versions`: installed version (or None) of tensorflow, tensorflow-tpu, libtpu, libtpu-nightly;
    `pinned`: the tensorflow versions of requirements.txt's sets."""
    tf_tpu, tf_plain = versions.get("tensorflow-tpu"), versions.get("tensorflow")
    libtpu = versions.get("libtpu") or versions.get("libtpu-nightly")
    found = ", ".join(f"{name} {version}" for name, version in versions.items() if version) or "none of them"
    if not tf_tpu:
        return fail(f"tensorflow-tpu is not installed ({found})", "make setup (on the TPU VM)")
    if not libtpu:
        return fail(f"libtpu is not installed ({found})", "make setup (on the TPU VM)")
    if tf_plain:
        return fail(
            f"the plain tensorflow wheel is installed next to tensorflow-tpu ({found})",
            "remove .venv and run make setup again",
        )
    if pinned and tf_tpu not in pinned:
        return warn(
            f"{found}; requirements.txt's TensorFlow sets pin tensorflow {' or '.join(pinned)}",
            "make setup (TF=X.Y for another set)",
        )
    return passed(found)


def check_lock_file(
    lock_path: str = LOCK_FILE, devices: Sequence[str] | None = None, proc_root: str = "/proc"
) -> Verdict:
    devices = device_files() if devices is None else devices
    holders, hidden = device_holders(devices, proc_root) if devices else ({}, 0)
    held = ", ".join(f"pid {pid} ({command[:60]})" for pid, command in sorted(holders.items()))
    locked = os.path.exists(lock_path)
    if holders:
        return warn(
            f"the TPU is in use by {held}{' (lock file ' + lock_path + ')' if locked else ''}: a new run "
            "fails with 'TPU in use' (on a Pod slice the tpu-runtime service holds it on purpose)",
            "wait for it to finish, or `make tpu-cleanup` to kill it",
        )
    if locked:
        unsure = f" (could not inspect {hidden} processes of other users)" if hidden else ""
        return warn(
            f"stale lock file {lock_path}: no process holds the TPU{unsure}; the next run may fail with 'TPU in use'",
            "make tpu-cleanup",
        )
    return passed("no lock file, no process holds the TPU")


def check_log_dir(log_dir: str | None) -> Verdict:
    path = log_dir or DEFAULT_TPU_LOG_DIR
    source = "TPU_LOG_DIR" if log_dir else "TPU_LOG_DIR unset, libtpu default"
    existing = path
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if os.path.exists(path) and not os.path.isdir(path):
        return warn(
            f"{source} {path} is not a directory: libtpu's logs are lost",
            "export TPU_LOG_DIR=/tmp/tpu_logs (make sets it)",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        return warn(
            f"{source} {path} is not writable: libtpu's compiler and runtime logs are lost",
            f"export TPU_LOG_DIR to a writable folder, or fix the permissions of {existing}",
        )
    return passed(f"{source} {path} is writable" + ("" if existing == path else " (created on first use)"))


def _pinned_tensorflow(requirements: Path = REQUIREMENTS) -> list[str]:
    """The tensorflow version of each of requirements.txt's TensorFlow sets."""
    try:
        sets = tensorflow_sets.load(requirements)
    except (OSError, ValueError):
        return []
    return [sets.tensorflow(name) for name in sets.names()]


def tensorflow_on_the_tpu(on_tpu_vm: bool, chosen: str | None, requirements: Path = REQUIREMENTS) -> tuple[str, str]:
    """(the TensorFlow version the TPU runs, where that comes from): on a TPU VM the installed
    tensorflow-tpu; anywhere else the set `make setup` installs on a TPU VM (TF=..., else its default)."""
    if on_tpu_vm:
        installed = installed_versions(("tensorflow-tpu", "tensorflow"))
        version = installed["tensorflow-tpu"] or installed["tensorflow"]
        if version:
            return version, "installed"
    sets = tensorflow_sets.load(requirements)
    name = sets.resolve(chosen, tpu_vm=True)
    origin = f"the set make setup TF={chosen} installs" if chosen else "the TPU VM default set of make setup"
    return sets.tensorflow(name), origin


def installed_versions(names: Sequence[str] = ("tensorflow", "tensorflow-tpu", "libtpu", "libtpu-nightly")) -> dict:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@rule("tpu.support")
def tpu_support(ctx: Context) -> Verdict:
    """The support matrix's line for the project's TPU type and the TensorFlow it would run there."""
    try:
        version, origin = tensorflow_on_the_tpu(ctx.on_tpu_vm, os.environ.get("TF") or None)
    except (OSError, ValueError) as error:
        return warn(f"the TensorFlow sets of requirements.txt: {error}", "fix requirements.txt's TF= lines")
    try:
        hosts = topology_lib.topology(ctx.tpu_type).hosts
    except ValueError:
        hosts = 1
    finding = support.check(ctx.tpu_type, version, hosts)
    message = f"{finding.message} (TF {version}: {origin})"
    return passed(message) if finding.supported else warn(message, finding.fix)


@rule("tpu.devices", tpu_vm_only=True)
def tpu_devices(ctx: Context) -> Verdict:
    expected = None
    if ctx.target.kind == "tpu":
        topo = topology_lib.topology(ctx.target.tpu_type)
        expected = topo.chips // topo.hosts
    return check_tpu_devices(device_files(), expected)


@rule("tpu.software", tpu_vm_only=True)
def tpu_software(ctx: Context) -> Verdict:
    return check_software(installed_versions(), _pinned_tensorflow())


@rule("tpu.lock_file", tpu_vm_only=True)
def tpu_lock_file(ctx: Context) -> Verdict:
    return check_lock_file(LOCK_FILE, device_files())


@rule("tpu.log_dir", tpu_vm_only=True)
def tpu_log_dir(ctx: Context) -> Verdict:
    return check_log_dir(os.environ.get("TPU_LOG_DIR"))
