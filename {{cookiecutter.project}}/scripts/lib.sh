#!/usr/bin/env bash
# Helpers shared by the scripts in this folder; source it, don't run it.
#
#   run CMD ARGS...   prints the command (shell-quoted, one line) and runs it; with DRY_RUN=1 it
#                     only prints it, on stdout, so that the output can be pasted into a shell.
#   is_tpu_vm         true on a Cloud TPU VM: TPU_VM=1/0 decides if set, else the TPU device files
#                     (/dev/accel* on v2-v4, /dev/vfio/<n> on v5e, v5p, v6e). No network calls.
#   die MESSAGE       prints "error: MESSAGE" on stderr and exits 1.
#   require_gcloud_login GCLOUD
#                     gcloud is installed and has an account (a local check, no network), else
#                     one line with the fix.

dry_run() {
    [ "${DRY_RUN:-0}" = 1 ]
}

die() {
    echo "error: $*" >&2
    exit 1
}

# Quotes one word for a POSIX shell, leaving plain words (flags, paths, key=value) readable; in
# "--flag=value" and "NAME=value" only the value is quoted: --command='cd x && make train'.
shell_quote() {
    local word="$1" prefix=""
    if [[ "$word" =~ ^(-{0,2}[A-Za-z_][A-Za-z0-9_.-]*=)(.*)$ ]]; then
        prefix="${BASH_REMATCH[1]}"
        word="${BASH_REMATCH[2]}"
    fi
    case "$word" in
        "" | *[!A-Za-z0-9_@%+=:,./~^-]*)
            printf "%s'%s'" "$prefix" "$(printf '%s' "$word" | sed "s/'/'\\\\''/g")"
            ;;
        *)
            printf '%s%s' "$prefix" "$word"
            ;;
    esac
}

quote_command() {
    local first=1 word
    for word in "$@"; do
        if [ "$first" = 1 ]; then first=0; else printf ' '; fi
        shell_quote "$word"
    done
    printf '\n'
}

run() {
    if dry_run; then
        quote_command "$@"
    else
        printf '+ %s' "$(quote_command "$@")" >&2
        printf '\n' >&2
        "$@"
    fi
}

require_gcloud_login() {
    local gcloud="$1" account
    command -v "$gcloud" >/dev/null 2>&1 || die "$gcloud is not installed: install the Google Cloud CLI" \
        "(https://cloud.google.com/sdk/docs/install), then run gcloud auth login"
    account=$("$gcloud" config get-value account 2>/dev/null) || account=""
    [ -n "$account" ] || die "gcloud has no account to act as: run gcloud auth login (on a TPU VM, gcloud uses the" \
        "VM's service account); CLOUDSDK_CONFIG=${CLOUDSDK_CONFIG:-~/.config/gcloud}"
}

is_tpu_vm() {
    case "${TPU_VM:-}" in
        1 | true | yes) return 0 ;;
        0 | false | no) return 1 ;;
    esac
    compgen -G '/dev/accel[0-9]*' >/dev/null || compgen -G '/dev/vfio/[0-9]*' >/dev/null
}

# SUDO: "sudo" for commands that need root on a TPU VM (passwordless there); empty when root.
# Use it as  run "${SUDO[@]}" CMD ...
# shellcheck disable=SC2034  # used by the scripts that source this file
if [ "$(id -u)" = 0 ]; then
    SUDO=()
else
    SUDO=(sudo)
fi
