#!/usr/bin/env bash
# Creates the virtual environment VENV (default .venv) and installs the project into it.
#
#   bash scripts/setup.sh .venv          # what `make setup` runs
#   DRY_RUN=1 bash scripts/setup.sh .venv  # print the commands only
#   TPU_VM=1 / TPU_VM=0                  # force the TPU VM / the CPU path
#   TF=2.19 / TF=2.20                    # the TensorFlow set (default: the TPU VM default on a TPU VM, else 2.20)
#   EXTRAS=dev                           # install the test and packaging tools too (requirements-dev.txt)
#
# requirements.txt is the one place where versions are pinned; pyproject.toml reads it, and
# core/tensorflow_sets.py reads its TensorFlow sets (the default, and the sets that replace
# tensorflow, tf-keras, tensorboard and apache-beam together).
#
# Off a TPU VM, the default set: `pip install -e .` (tensorflow from PyPI: CPU, or GPU with CUDA).
# Another set: its requirements first, then the project with --no-deps (its metadata lists the
# default set's pins).
#
# On a TPU VM (detected from /dev/accel* or /dev/vfio/<n>) the TPU build of TensorFlow is needed:
#   * tensorflow-tpu==<the set's tensorflow version> replaces tensorflow. Both wheels install the
#     same `tensorflow` Python package, so the plain tensorflow wheel must never land next to it.
#   * libtpu at the set's "TPU VM" pin in requirements.txt: tensorflow-tpu 2.19.1 requires libtpu
#     0.0.10 exactly; 2.20.0 requires `libtpu~=0.0.14`, a range that also admits today's newest
#     libtpu, which follows JAX releases, so it is pinned to 0.0.14. LIBTPU_VERSION=x.y.z picks
#     another; LIBTPU_VERSION= (empty) lets pip choose.
#   * tf-keras requires the plain tensorflow wheel at the same minor version, which would land
#     next to tensorflow-tpu: it is installed with --no-deps, and so is the project itself (its
#     dependencies are the same requirements, installed just before).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

venv="${1:-.venv}"
python="${PYTHON:-python3}"
requirements="requirements.txt"
dev_requirements=()
if [ "${EXTRAS:-}" = dev ]; then
    dev_requirements=(-r requirements-dev.txt)
elif [ -n "${EXTRAS:-}" ]; then
    die "EXTRAS=${EXTRAS}: the project has one extra, dev (EXTRAS=dev)"
fi

[ -f "$requirements" ] || die "$requirements not found (run from the project)"

sets=("$python" "src/{{ cookiecutter.package }}/core/tensorflow_sets.py" --requirements "$requirements")
tpu_flag=()
if is_tpu_vm; then
    tpu_flag=(--tpu-vm)
fi
# The set to install (TF=... or this machine's default), its tensorflow version and the default set.
tf_set=$("${sets[@]}" --set "${TF:-}" "${tpu_flag[@]}" --print name) || exit 1
tf_version=$("${sets[@]}" --set "$tf_set" --print tensorflow)
default_set=$("${sets[@]}" --print name)
libtpu_pin=$("${sets[@]}" --set "$tf_set" --print libtpu)
if [ -n "${LIBTPU_VERSION+set}" ]; then
    libtpu_pin="${LIBTPU_VERSION:+libtpu==${LIBTPU_VERSION}}"
fi
# The set's requirements, kept in the virtual environment as a record of what was installed.
set_file="$venv/requirements-tf${tf_set}.txt"

pip=("$venv/bin/python" -m pip)

ensure_venv_module() {
    # Ubuntu images (TPU VMs included) ship python3 without ensurepip until python3-venv is added.
    if "$python" -c 'import ensurepip' >/dev/null 2>&1; then
        return 0
    fi
    if is_tpu_vm; then
        local minor
        minor=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        run "${SUDO[@]}" apt-get update -q
        run "${SUDO[@]}" apt-get install -y -q "python${minor}-venv"
    else
        die "$python has no venv support: install your distribution's python3-venv package"
    fi
}

write_set_file() {
    # $1: a grep -v pattern of lines to leave out (none: keep all)
    if dry_run; then
        echo "# $set_file: requirements.txt's TensorFlow set $tf_set${1:+, without its tensorflow and tf-keras lines}:"
        "${sets[@]}" --set "$tf_set" | grep -v -E "${1:-^$}" | sed 's/^/#   /' || true
    else
        "${sets[@]}" --set "$tf_set" | grep -v -E "${1:-^$}" >"$set_file" || true
    fi
}

install_cpu() {
    if [ "$tf_set" = "$default_set" ]; then
        local target="."
        if [ "${EXTRAS:-}" = dev ]; then
            target=".[dev]"
        fi
        run "${pip[@]}" install -e "$target"
        return
    fi
    echo "TensorFlow set $tf_set (tensorflow==${tf_version}) instead of the default $default_set" >&2
    write_set_file ""
    run "${pip[@]}" install -r "$set_file" "${dev_requirements[@]}"
    run "${pip[@]}" install --no-deps -e .
}

install_tpu() {
    local drop='^(tensorflow|tf[-_]keras)[[:space:]]*([=<>!~;#[]|$)'
    local tpu_packages=("tensorflow-tpu==${tf_version}")
    local tf_keras
    tf_keras=$("${sets[@]}" --set "$tf_set" | grep -E '^tf[-_]keras' || true)
    if [ -n "$libtpu_pin" ]; then
        tpu_packages+=("$libtpu_pin")
    fi
    write_set_file "$drop"

    echo "TPU VM: tensorflow-tpu==${tf_version} (TensorFlow set $tf_set) instead of tensorflow==${tf_version}" >&2
    run "${pip[@]}" install "${tpu_packages[@]}" -r "$set_file" "${dev_requirements[@]}"
    if [ -n "$tf_keras" ]; then
        run "${pip[@]}" install --no-deps "$tf_keras"
    fi
    run "${pip[@]}" install --no-deps -e .

    if ! dry_run && "${pip[@]}" show tensorflow >/dev/null 2>&1; then
        die "the plain tensorflow wheel got installed next to tensorflow-tpu; remove $venv and rerun"
    fi
}

if is_tpu_vm; then
    ensure_venv_module
fi
run "$python" -m venv "$venv"
run "${pip[@]}" install --upgrade pip
if is_tpu_vm; then
    install_tpu
else
    install_cpu
fi
if ! dry_run; then
    echo "Installed TensorFlow set $tf_set into $venv." >&2
fi
