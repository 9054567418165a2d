"""The daemon as operators run it: real ``tierd serve`` processes, real HTTP, real signals.

Every process gets a timeout and is killed at teardown even when a test fails.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import tierd

pytestmark = pytest.mark.timeout(120)

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def clean_env(**extra: str) -> dict[str, str]:
    """The runner's environment without any TIERD_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(extra)
    return env


def tierd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tierd.cli", *args]


def tierctl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tierd_client.tierctl", *args]


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 30.0) -> Any:
    """Run a command that should finish by itself; capture its output."""
    return subprocess.run(
        cmd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=timeout,
    )


def http_get(url: str, method: str = "GET", token: str | None = None
             ) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body); HTTP errors are returned, not raised.  ``token``: the admin
    API's bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@dataclass
class Tierd:
    """One ``tierd serve`` subprocess; its stderr goes to a file (no pipe to fill up)."""

    proc: subprocess.Popen[bytes]
    data_dir: Path
    stderr_path: Path
    endpoints: dict[str, Any] = field(default_factory=dict)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        """Wait until this process has written endpoints.json; return its content."""
        path = self.data_dir / "endpoints.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"tierd exited with {self.proc.returncode}:\n{self.stderr}")
            try:
                doc: dict[str, Any] = json.loads(path.read_text())
            except (FileNotFoundError, ValueError):
                doc = {}
            if doc.get("pid") == self.proc.pid:
                self.endpoints = doc
                return doc
            time.sleep(0.05)
        pytest.fail(f"tierd did not become ready within {timeout}s:\n{self.stderr}")

    def url(self, door: str) -> str:
        return str((self.endpoints or self.wait_ready())[door]["url"])

    def wait_exit(self, timeout: float = STOP_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tierd did not exit within {timeout}s:\n{self.stderr}")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.wait_exit()


Spawn = Callable[..., Tierd]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(data_dir, *args, env=None)`` starts ``tierd serve --data-dir data_dir`` on
    ephemeral ports (later ``args`` override); every process is killed at teardown."""
    procs: list[Tierd] = []

    def start(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Tierd:
        stderr_path = tmp_path / f"tierd-{len(procs)}.stderr"
        cmd = tierd_cmd(
            "serve",
            "--data-dir",
            str(data_dir),
            "--s3-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            *args,
        )
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env or clean_env()
            )
        t = Tierd(proc, data_dir, stderr_path)
        procs.append(t)
        return t

    yield start
    for t in procs:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait(10)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


# --- serving --------------------------------------------------------------------------------


def test_serves_health_and_status(spawn: Spawn, data_dir: Path) -> None:
    t = spawn(data_dir)
    ep = t.wait_ready()
    assert ep["data_dir"] == str(data_dir)
    for door in ("s3", "admin"):
        assert ep[door]["host"] == "127.0.0.1" and ep[door]["port"] > 0
        status, _, body = http_get(t.url(door) + "/healthz")
        assert (status, body.strip()) == (200, b"ok")

    token = (data_dir / "admin-token").read_text().strip()
    assert (data_dir / "admin-token").stat().st_mode & 0o777 == 0o600
    status, headers, body = http_get(t.url("admin") + "/v1/status", token=token)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    st = json.loads(body)
    assert st["version"] == tierd.__version__
    assert st["pid"] == t.proc.pid
    assert st["data_dir"] == str(data_dir)
    assert isinstance(st["uptime_seconds"], float) and 0 <= st["uptime_seconds"] < 60
    for key in ("inodes", "bytes", "buckets", "open_files"):
        assert isinstance(st[key], int) and st[key] >= 0, key
    assert st["buckets"] == 0 and st["open_files"] == 0
    assert st["meta"]["engine"] == "group-lmdb" and st["meta"]["entries"] > 0
    assert st["listen"] == {
        "s3": f"127.0.0.1:{ep['s3']['port']}",
        "admin": f"127.0.0.1:{ep['admin']['port']}",
    }

    # the layout and the lock
    for sub in ("meta", "hot", "warm", "cold"):
        assert (data_dir / sub).is_dir(), sub
    assert (data_dir / "tierd.lock").read_text().strip() == str(t.proc.pid)
    assert "listening" in t.stderr and "component=daemon" in t.stderr


def test_admin_errors_are_json(spawn: Spawn, data_dir: Path) -> None:
    t = spawn(data_dir)
    t.wait_ready()
    token = (data_dir / "admin-token").read_text().strip()
    status, headers, body = http_get(t.url("admin") + "/no/such/thing", token=token)
    assert status == 404 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body)["error"] == "not_found"
    status, _, body = http_get(t.url("admin") + "/v1/status", method="DELETE", token=token)
    assert status == 405 and json.loads(body)["error"] == "method_not_allowed"
    # without the token: 401 everywhere but /healthz (unknown paths too: nothing is revealed)
    for path in ("/v1/status", "/no/such/thing"):
        status, headers, body = http_get(t.url("admin") + path)
        assert status == 401 and json.loads(body)["error"] == "unauthorized", path


def test_s3_door_refuses_anonymous_requests(spawn: Spawn, data_dir: Path) -> None:
    """The S3 listener is up and authenticates: unsigned requests get AccessDenied XML,
    except that a missing bucket is NoSuchBucket to anyone, as on S3 (the gateway's own
    tests in tests/s3 cover the protocol)."""
    t = spawn(data_dir)
    for path, method, status_code, code in [("/", "GET", 403, b"AccessDenied"),
                                             ("/bucket/key", "PUT", 404, b"NoSuchBucket"),
                                             # a form upload into a missing bucket
                                             ("/healthz", "POST", 404, b"NoSuchBucket")]:
        status, headers, body = http_get(t.url("s3") + path, method=method)
        assert status == status_code, (method, path, status)
        assert headers["Content-Type"].startswith("application/xml")
        assert b"<Code>" + code + b"</Code>" in body
        assert headers["x-amz-request-id"].encode() in body
    status, _, body = http_get(t.url("s3") + "/bucket", method="HEAD")
    assert status == 404 and body == b""
    status, _, body = http_get(t.url("s3") + "/healthz")
    assert status == 200


def test_json_log_format(spawn: Spawn, data_dir: Path) -> None:
    t = spawn(data_dir, "--log-format", "json", "--log-level", "debug")
    http_get(t.url("admin") + "/healthz")
    assert t.stop() == 0
    records = [json.loads(line) for line in t.stderr.splitlines() if line.strip()]
    assert records, "no log lines"
    assert all({"ts", "level", "component", "msg"} <= r.keys() for r in records)
    listening = [r for r in records if r["msg"] == "listening"]
    assert {r["door"] for r in listening} == {"s3", "admin"}
    assert any(r["component"] == "admin.access" and r["path"] == "/healthz" for r in records)


def test_log_level_filters(spawn: Spawn, data_dir: Path) -> None:
    t = spawn(data_dir, env=clean_env(TIERD_LOG_LEVEL="warning"))
    t.wait_ready()
    assert t.stop() == 0
    assert "level=info" not in t.stderr


# --- lock and signals -----------------------------------------------------------------------


def test_second_instance_on_same_data_dir_refuses(spawn: Spawn, data_dir: Path) -> None:
    first = spawn(data_dir)
    first.wait_ready()
    second = spawn(data_dir)
    assert second.wait_exit() != 0
    err = second.stderr
    assert "already running" in err
    assert str(data_dir) in err
    assert f"pid {first.proc.pid}" in err
    # the refused instance must not have disturbed the first one
    assert http_get(first.url("admin") + "/healthz")[0] == 200
    assert json.loads((data_dir / "endpoints.json").read_text())["pid"] == first.proc.pid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_and_releases_lock(
    spawn: Spawn, data_dir: Path, sig: signal.Signals
) -> None:
    t = spawn(data_dir)
    t.wait_ready()
    started = time.monotonic()
    assert t.stop(sig) == 0, t.stderr
    assert time.monotonic() - started < 5, "shutdown was not prompt"
    assert "stopped cleanly" in t.stderr and sig.name in t.stderr
    assert "Traceback" not in t.stderr
    assert not (data_dir / "endpoints.json").exists()
    assert (data_dir / "tierd.lock").read_text() == ""
    # the lock is free: a new instance starts on the same data directory
    again = spawn(data_dir)
    again.wait_ready()
    assert http_get(again.url("admin") + "/healthz")[0] == 200
    assert again.stop() == 0


def test_killed_daemon_leaves_no_stale_lock(spawn: Spawn, data_dir: Path) -> None:
    t = spawn(data_dir)
    t.wait_ready()
    t.proc.kill()
    t.wait_exit()
    again = spawn(data_dir)
    again.wait_ready()
    assert again.stop() == 0


# --- start-up failures ----------------------------------------------------------------------


def test_port_in_use_is_a_clear_error(spawn: Spawn, data_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t = spawn(data_dir, "--admin-listen", f"127.0.0.1:{port}")
        assert t.wait_exit() == 1
    err = t.stderr
    assert f"127.0.0.1:{port}" in err and "address already in use" in err
    assert "admin_listen" in err and "Traceback" not in err
    # a failed start releases the lock and removes nothing it did not own
    again = spawn(data_dir)
    again.wait_ready()
    assert again.stop() == 0


def test_unusable_data_dir_is_a_clear_error(spawn: Spawn, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    t = spawn(not_a_dir)
    assert t.wait_exit() == 1
    assert f"cannot use {not_a_dir} as a directory: it or a directory above it is a file" \
        in t.stderr and "Traceback" not in t.stderr


def test_bad_config_file_exits_2_naming_key_and_file(tmp_path: Path, data_dir: Path) -> None:
    cfg = tmp_path / "tierd.toml"
    cfg.write_text('s3_listen = "127.0.0.1:99999"\n')
    r = run(tierd_cmd("serve", "--config", str(cfg), "--data-dir", str(data_dir)))
    assert r.returncode == 2
    assert "s3_listen" in r.stderr and str(cfg) in r.stderr and "out of range" in r.stderr
    assert not data_dir.exists(), "nothing may be created before the config is accepted"

    cfg.write_text('log_levle = "debug"\n')
    r = run(tierd_cmd("serve", "--data-dir", str(data_dir)), env=clean_env(TIERD_CONFIG=str(cfg)))
    assert r.returncode == 2 and "log_levle" in r.stderr and "did you mean log_level" in r.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [("TIERD_ADMIN_LISTEN", "localhost"), ("TIERD_UMASK", "999"), ("TIERD_COLOUR", "1")],
)
def test_bad_env_var_exits_2_naming_it(data_dir: Path, name: str, value: str) -> None:
    r = run(tierd_cmd("serve", "--data-dir", str(data_dir)), env=clean_env(**{name: value}))
    assert r.returncode == 2, r.stderr
    assert name in r.stderr and "configuration error" in r.stderr


def test_bad_flag_exits_2(data_dir: Path) -> None:
    r = run(tierd_cmd("serve", "--data-dir", str(data_dir), "--log-format", "xml"))
    assert r.returncode == 2 and "--log-format" in r.stderr and "log_format" in r.stderr


def test_version_and_help() -> None:
    r = run(tierd_cmd("version"))
    assert r.returncode == 0 and r.stdout.strip() == f"tierd {tierd.__version__}"
    r = run(tierd_cmd("serve", "--help"))
    assert r.returncode == 0
    for flag in ("--config", "--data-dir", "--s3-listen", "--admin-listen", "--mount"):
        assert flag in r.stdout
    assert "TIERD_S3_LISTEN" in r.stdout


# --- tierctl --------------------------------------------------------------------------------


def test_tierctl_status_and_health(spawn: Spawn, data_dir: Path) -> None:
    t = spawn(data_dir)
    admin = t.url("admin")
    r = run(tierctl_cmd("--admin-url", admin, "--data-dir", str(data_dir), "status"))
    assert r.returncode == 0, r.stderr
    assert f"pid {t.proc.pid}" in r.stdout and str(data_dir) in r.stdout
    assert "inodes" in r.stdout and "lmdb" in r.stdout

    token = (data_dir / "admin-token").read_text().strip()
    r = run(tierctl_cmd("status", "--json"),
            env=clean_env(TIERD_ADMIN_URL=admin, TIERD_ADMIN_TOKEN=token))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == t.proc.pid

    # the data directory alone finds both the daemon (endpoints.json) and the token
    r = run(tierctl_cmd("status", "--json"), env=clean_env(TIERD_DATA_DIR=str(data_dir)))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == t.proc.pid

    # a wrong token: one line, exit 1
    r = run(tierctl_cmd("--admin-url", admin, "--token", "not-the-token-0123456789", "status"))
    assert r.returncode == 1 and "HTTP 401" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

    r = run(tierctl_cmd("--admin-url", admin, "health"))
    assert (r.returncode, r.stdout.strip()) == (0, "ok")


def test_tierctl_unreachable_exits_1() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    for cmd in ("status", "health"):
        r = run(tierctl_cmd("--admin-url", url, cmd))
        assert r.returncode == 1
        assert "cannot reach" in r.stderr and url in r.stderr and "Traceback" not in r.stderr


def test_tierctl_against_the_s3_port_says_so(spawn: Spawn, data_dir: Path) -> None:
    t = spawn(data_dir)
    r = run(tierctl_cmd("--admin-url", t.url("s3"), "status"))
    assert r.returncode == 1 and "not a JSON answer" in r.stderr
