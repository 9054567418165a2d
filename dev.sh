#!/usr/bin/env bash
# One entry point for a fresh Debian machine:
#   ./dev.sh serve [tierd serve options]   install everything, run the daemon on embedded defaults
#   ./dev.sh test  [pytest options]        install everything, run the whole test suite
# Installing is idempotent: system packages only when missing, the venv only when absent,
# the package re-installed (editable) only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV=${TIERD_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}

apt_packages=(fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv attr fio rsync git sqlite3 util-linux rclone s3cmd acl systemd)

need_apt=()
install_system() {
    command -v dpkg-query >/dev/null 2>&1 || return 0
    for p in "${apt_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
    done
    # python3-dev/python3-venv matter only for Debian's own python; a pyenv/uv python has both.
    if "$PY" -c 'import venv, sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' 2>/dev/null; then
        local keep=()
        for p in "${need_apt[@]}"; do [[ $p == python3-dev || $p == python3-venv ]] || keep+=("$p"); done
        need_apt=("${keep[@]}")
    fi
    [ ${#need_apt[@]} -eq 0 ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "dev.sh: installing system packages: ${need_apt[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
}

install_python() {
    if [ ! -x "$VENV/bin/python" ]; then
        echo "dev.sh: creating virtual environment in $VENV" >&2
        "$PY" -m venv "$VENV"
        "$VENV/bin/pip" install -q --upgrade pip
    fi
    local stamp="$VENV/.tierd-installed"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "dev.sh: installing tierd and its test dependencies" >&2
        # torch for the checkpoint SDK: a CPU-only build when the index has one (a tenth of
        # the size of the CUDA one, which pip would otherwise pick); any build works
        "$VENV/bin/pip" install -q "torch==2.13.0+cpu" >/dev/null 2>&1 || true
        "$VENV/bin/pip" install -q -e ".[test]"
        touch "$stamp"
    fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    serve)
        install_system; install_python
        exec "$VENV/bin/tierd" serve "$@"
        ;;
    test)
        install_system; install_python
        "$VENV/bin/ruff" check tierd fuse clients tests bench
        "$VENV/bin/mypy"
        exec "$VENV/bin/pytest" "$@"
        ;;
    setup)
        install_system; install_python
        ;;
    *)
        echo "usage: ./dev.sh serve [options] | ./dev.sh test [pytest options] | ./dev.sh setup" >&2
        exit 2
        ;;
esac
