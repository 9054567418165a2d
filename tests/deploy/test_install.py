"""Installing tierd as the documentation says, for real: the install block of
docs/operations.md ("Installing": a venv under /opt/tierd with its commands linked into
/usr/local/bin, since Debian 12's pip refuses `pip install .` as root) and `./dev.sh serve`
(README, "Set-up": the runtime only, saying what it does).

Both run in temporary directories: /opt/tierd and /usr/local/bin become directories under
the test's own, the clone is a copy of the files a clone holds for building, and dev.sh gets
its own venv (``TIERD_VENV``), never the team's ``.venv``.  Packages come from the index pip
is configured with (a pip cache makes a second run quick)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "docs" / "operations.md"
MARK = "<!-- tests/deploy/test_install.py runs the commands of the next block as written -->"

pytestmark = pytest.mark.timeout(900)


def install_block() -> list[str]:
    """The command lines of the fenced block after :data:`MARK`."""
    text = OPS.read_text()
    assert MARK in text, "docs/operations.md lost its install block"
    m = re.search(re.escape(MARK) + r"\n```sh\n(.*?)\n```", text, re.S)
    assert m, "the install block is not a ```sh block right after the mark"
    return [line for line in m.group(1).splitlines() if line.strip()]


def installed(package: str) -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True,
                       text=True)
    return "install ok installed" in r.stdout


def clone_copy(dest: Path) -> Path:
    """What a clone holds for building (the working tree's packages, no venv, no caches)."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("tierd", "fuse", "clients"):
        shutil.copytree(ROOT / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TIERD_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(extra)
    return env


def test_the_documented_install_commands_work(tmp_path: Path) -> None:
    lines = install_block()
    assert lines[0].startswith("sudo apt-get install -y ")
    assert any("python3 -m venv /opt/tierd" in line for line in lines)
    # the apt line: its packages are what dev.sh installs for running tierd; checked here,
    # not installed (python3-venv/-dev only matter for Debian's own python)
    if shutil.which("dpkg-query"):
        for pkg in lines[0].split()[4:]:
            if pkg.startswith("python3-"):
                continue
            assert installed(pkg), f"{pkg} of the install block is not installed here"
    fake_root = tmp_path / "root"
    opt, bin_dir = fake_root / "opt" / "tierd", fake_root / "usr" / "local" / "bin"
    bin_dir.mkdir(parents=True)
    clone = clone_copy(tmp_path / "clone")
    env = clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    for line in lines[1:]:
        cmd = (line.removeprefix("sudo ").replace("/opt/tierd", str(opt))
               .replace("/usr/local/bin/", f"{bin_dir}/"))
        r = subprocess.run(["bash", "-c", cmd], cwd=clone, capture_output=True, text=True,
                           env=env, timeout=800)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.stdout.splitlines() == ["tierd 0.1.0", "tierctl 0.1.0"], r.stdout
    tierd = bin_dir / "tierd"
    assert tierd.is_symlink() and Path(os.readlink(tierd)) == opt / "bin" / "tierd"
    # a copy, not the clone: it works with the clone gone, and has no test tools
    shutil.rmtree(clone)
    py = opt / "bin" / "python"
    r = subprocess.run([str(py), "-c", "import tierd, tierd_client, tierd_fuse; "
                        "print(tierd.__file__)"], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(str(opt)), r.stdout + r.stderr
    assert subprocess.run([str(py), "-c", "import pytest"], capture_output=True,
                          env=env, cwd=tmp_path).returncode != 0

    # the linked command runs the daemon; the linked tierctl talks to it
    data = tmp_path / "data"
    log = tmp_path / "tierd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(tierd), "serve", "--data-dir", str(data), "--s3-listen",
                                 "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
                                stdout=out, stderr=out, env=env, stdin=subprocess.DEVNULL,
                                cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        doc: dict[str, object] = {}
        while time.monotonic() < deadline and doc.get("pid") != proc.pid:
            assert proc.poll() is None, log.read_text()
            try:
                doc = json.loads((data / "endpoints.json").read_text())
            except (OSError, ValueError):
                time.sleep(0.1)
        admin = doc["admin"]["url"]  # type: ignore[index]
        with urllib.request.urlopen(f"{admin}/healthz", timeout=10) as resp:
            assert resp.read() == b"ok\n"
        r = subprocess.run([str(bin_dir / "tierctl"), "--data-dir", str(data), "health"],
                           capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log.read_text()[-3000:]


def test_dev_sh_serve_installs_the_runtime_only_and_says_what_it_does(
        tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = clean_env(TIERD_VENV=str(venv))
    r = subprocess.run([str(ROOT / "dev.sh"), "serve", "--help"], capture_output=True,
                       text=True, env=env, timeout=800, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    py = venv / "bin" / "python"
    for module in ("pytest", "moto", "mypy", "torch", "schemathesis"):
        got = subprocess.run([str(py), "-c", f"import {module}"], capture_output=True)
        assert got.returncode != 0, f"./dev.sh serve installed {module}"
    assert subprocess.run([str(py), "-c", "import tierd, tierd_fuse, pyfuse3"],
                          capture_output=True).returncode == 0
    said = [line for line in r.stderr.splitlines() if line.startswith("dev.sh: ")]
    assert said[0] == f"dev.sh: creating a virtual environment in {venv}"
    assert any("installing tierd (editable) and its runtime dependencies" in line
               for line in said), said
    assert said[-1].startswith("dev.sh: starting tierd serve --help")
    assert "Collecting" in r.stdout + r.stderr  # pip's own progress is shown, not hidden
    assert "Usage: " in r.stdout and "--data-dir" in r.stdout  # tierd serve --help ran
    # a second run installs nothing and says so by saying nothing but the start
    r = subprocess.run([str(ROOT / "dev.sh"), "serve", "--help"], capture_output=True,
                       text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0
    assert [line for line in r.stderr.splitlines() if line.startswith("dev.sh: ")] == [
        "dev.sh: starting tierd serve --help (Ctrl-C stops it)"]
