#!/usr/bin/env bash
# One entry point for a fresh Debian machine:
#   ./dev.sh serve [tierd serve options]   install tierd and what it needs to run, run the
#                                          daemon on embedded defaults
#   ./dev.sh test  [pytest options]        install that plus the test tools, run ruff, mypy
#                                          and the whole test suite
#   ./dev.sh setup                         install both, run nothing
# Installing is idempotent: system packages only when missing, the venv only when absent,
# each pip step again only when pyproject.toml changed since it last ran.  Every step says
# what it does, and pip and apt show their own progress (a first run takes minutes: the
# README says how long each command took on a bare machine).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV=${TIERD_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}

# System packages: what building and running tierd needs (pyfuse3 compiles against libfuse3;
# fusermount3 and umount unmount), then what only the tests and benchmarks use.
runtime_apt=(fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv util-linux)
test_apt=(attr fio rsync git sqlite3 rclone s3cmd acl systemd chromium postgresql)

say() { echo "dev.sh: $*" >&2; }

install_system() {
    command -v dpkg-query >/dev/null 2>&1 || return 0
    local need=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
    done
    # python3-dev/python3-venv matter only for Debian's own python; a pyenv/uv python has both.
    if "$PY" -c 'import venv, sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' 2>/dev/null; then
        local keep=()
        for p in "${need[@]}"; do [[ $p == python3-dev || $p == python3-venv ]] || keep+=("$p"); done
        need=("${keep[@]}")
    fi
    [ ${#need[@]} -eq 0 ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    say "installing system packages with apt-get: ${need[*]}"
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${need[@]}"
}

# pip step NAME ARGS...: run `pip install ARGS` unless it already ran since pyproject.toml
# last changed (a stamp file per step in the venv).
pip_step() {
    local stamp="$VENV/.tierd-$1"
    shift
    if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
        return 0
    fi
    "$VENV/bin/pip" install "$@"
    touch "$stamp"
}

install_runtime() {
    install_system "${runtime_apt[@]}"
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating a virtual environment in $VENV"
        "$PY" -m venv "$VENV"
        say "upgrading pip in $VENV"
        "$VENV/bin/pip" install --upgrade pip
    fi
    if [ ! -f "$VENV/.tierd-runtime" ] || [ pyproject.toml -nt "$VENV/.tierd-runtime" ]; then
        say "installing tierd (editable) and its runtime dependencies into $VENV" \
            "(aiohttp, lmdb, pyfuse3 compiled against libfuse3, boto3, cryptography, ...)"
    fi
    pip_step runtime -e .
}

install_test() {
    install_runtime
    install_system "${test_apt[@]}"
    if [ ! -f "$VENV/.tierd-test" ] || [ pyproject.toml -nt "$VENV/.tierd-test" ]; then
        say "installing PyTorch for the checkpoint SDK tests, then the test tools" \
            "(pytest, hypothesis, moto, minio, awscli, mypy, ruff, kubernetes-validate," \
            "schemathesis)"
    fi
    # torch: exactly 2.13.0.  On the project's build machines pip finds its CPU-only wheel
    # on local disk (/opt/wheels, ~200 MB installed); a bare `torch` or a range admitting a
    # newer release makes pip choose the newest CUDA build from PyPI, several GB.  (The old
    # `torch==2.13.0+cpu` pin exists only on PyTorch's own index, so on other machines it
    # failed and the test extra then pulled that CUDA build unseen.)  Elsewhere, get the CPU
    # build with PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
    pip_step torch "torch==2.13.0"
    pip_step test -e ".[test]"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    serve)
        install_runtime && say "starting tierd serve $* (Ctrl-C stops it)"
        exec "$VENV/bin/tierd" serve "$@"
        ;;
    test)
        install_test
        say "ruff, mypy, then pytest"
        "$VENV/bin/ruff" check tierd fuse clients tests bench
        "$VENV/bin/mypy"
        exec "$VENV/bin/pytest" "$@"
        ;;
    setup)
        install_test
        ;;
    *)
        echo "usage: ./dev.sh serve [options] | ./dev.sh test [pytest options] | ./dev.sh setup" >&2
        exit 2
        ;;
esac
