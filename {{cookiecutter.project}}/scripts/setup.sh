#!/usr/bin/env bash
# Creates the virtual environment VENV (default .venv) and installs the project into it.
#
#   bash scripts/setup.sh .venv          # what `make setup` runs
#   DRY_RUN=1 bash scripts/setup.sh .venv  # print the commands only
#   TPU_VM=1 / TPU_VM=0                  # force the TPU VM / the CPU path
#   EXTRAS=dev                           # install the project as ".[dev]"
#
# requirements.txt is the one place where versions are pinned; pyproject.toml reads it.
#
# Off a TPU VM: `pip install -e .` (tensorflow from PyPI: CPU, or GPU with CUDA).
#
# On a TPU VM (detected from /dev/accel* or /dev/vfio/<n>) the TPU build of TensorFlow is needed:
#   * tensorflow-tpu==<the version of the tensorflow line> replaces tensorflow. Both wheels install
#     the same `tensorflow` Python package, so the plain tensorflow wheel must never land next to it.
#   * tensorflow-tpu 2.20.0 requires `libtpu~=0.0.14`, from PyPI (no extra index). That range also
#     admits today's newest libtpu, which follows JAX releases; libtpu is pinned to 0.0.14, the
#     release TensorFlow 2.20 declares as its minimum (2.19.1 pinned libtpu==0.0.10 exactly).
#     LIBTPU_VERSION=x.y.z picks another; LIBTPU_VERSION= (empty) lets pip choose in the range.
#   * tf-keras 2.20.x requires `tensorflow>=2.20,<2.21`, which would pull in the plain tensorflow
#     wheel: it is installed with --no-deps, and so is the project itself (its dependencies are the
#     same requirements.txt, installed just before).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

venv="${1:-.venv}"
python="${PYTHON:-python3}"
requirements="requirements.txt"
target="."
if [ -n "${EXTRAS:-}" ]; then
    target=".[${EXTRAS}]"
fi

[ -f "$requirements" ] || die "$requirements not found (run from the project)"

# "tensorflow==2.20.0" -> "2.20.0"; "tf-keras==2.20.1" stays a whole requirement line.
tf_version=$(sed -n -E 's/^tensorflow[[:space:]]*==[[:space:]]*([^[:space:];#]+).*/\1/p' "$requirements")
[ -n "$tf_version" ] || die "$requirements has no 'tensorflow==X.Y.Z' line"
tf_keras=$(sed -n -E 's/^(tf[-_]keras[^[:space:];#]*).*/\1/p' "$requirements")

default_libtpu=""
case "$tf_version" in
    2.20.*) default_libtpu="0.0.14" ;;
esac
libtpu_version="${LIBTPU_VERSION-$default_libtpu}"

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

install_cpu() {
    run "${pip[@]}" install -e "$target"
}

install_tpu() {
    local tpu_packages=("tensorflow-tpu==${tf_version}")
    # Everything else in requirements.txt, without the tensorflow and tf-keras lines; kept in the
    # virtual environment as a record of what was installed.
    local rest="$venv/requirements-tpu.txt"
    local drop='^(tensorflow|tf[-_]keras)[[:space:]]*([=<>!~;#[]|$)'
    if [ -n "$libtpu_version" ]; then
        tpu_packages+=("libtpu==${libtpu_version}")
    fi
    if dry_run; then
        echo "# $rest: $requirements without its tensorflow and tf-keras lines:"
        grep -v -E "$drop" "$requirements" | sed 's/^/#   /' || true
    else
        grep -v -E "$drop" "$requirements" >"$rest" || true
    fi

    echo "TPU VM: tensorflow-tpu==${tf_version} instead of tensorflow==${tf_version}" >&2
    run "${pip[@]}" install "${tpu_packages[@]}" -r "$rest"
    if [ -n "$tf_keras" ]; then
        run "${pip[@]}" install --no-deps "$tf_keras"
    fi
    run "${pip[@]}" install --no-deps -e "$target"

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
    echo "Installed into $venv." >&2
fi
