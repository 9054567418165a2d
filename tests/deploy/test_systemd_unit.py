"""deploy/systemd/tierd.service run for real, without systemd: its ExecStart under its
capability bounding set and NoNewPrivileges (setpriv) and its system call deny list
(libseccomp, the calls systemd-analyze lists for its groups), its ExecStop against the running
daemon and its ExecStopPost after a crash -- the commands as systemd would run them, with
systemd's ``$VAR``/``$$`` expansion.  Needs root, /dev/fuse, setpriv and fusermount3."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tierd_fuse.mount import find_mount, unmount

from .test_manifests import SYSTEMD, parse_unit

BIN = Path(sys.executable).parent
UNIT = parse_unit(SYSTEMD / "tierd.service")["Service"]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (the unit runs tierd as root)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    for tool in ("setpriv", "fusermount3"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def expand(line: str, env: dict[str, str]) -> list[str]:
    """An Exec*= line as systemd runs it: the leading ``-`` (ignore failure) dropped, a word
    that is exactly ``$VAR``/``${VAR}`` replaced by the variable split at whitespace (no
    words when unset), ``$$`` turned into ``$``."""
    words = shlex.split(line)
    words[0] = words[0].lstrip("-")
    out: list[str] = []
    for w in words:
        m = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", w)
        if m:
            out += env.get(m.group(1), "").split()
        else:
            out.append(w.replace("$$", "$"))
    return out


def setpriv_prefix() -> list[str]:
    """CapabilityBoundingSet= and NoNewPrivileges= of the unit, as setpriv options."""
    caps = UNIT["CapabilityBoundingSet"][0].split()
    bounding = "-all," + ",".join("+" + c.removeprefix("CAP_").lower() for c in caps)
    cmd = ["setpriv", "--inh-caps=-all", f"--bounding-set={bounding}"]
    if UNIT["NoNewPrivileges"] == ["yes"]:
        cmd.append("--no-new-privs")
    return cmd


def cap_mask(names: list[str]) -> int:
    bits = {"CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_SYS_ADMIN": 21}
    return sum(1 << bits[n] for n in names)



def denied_syscalls() -> tuple[list[str], int]:
    """SystemCallFilter=~GROUPS of the unit as syscall names (from systemd-analyze), and
    SystemCallErrorNumber= as an errno."""
    (spec,) = UNIT["SystemCallFilter"]
    assert spec.startswith("~"), "the unit's filter is a deny list"
    r = subprocess.run(["systemd-analyze", "syscall-filter", *spec[1:].split()],
                       capture_output=True, text=True, timeout=60, check=True)
    names = [w for line in r.stdout.splitlines()
             if line.startswith(" ") and not line.strip().startswith("#")
             for w in line.split() if not w.startswith("@")]
    assert len(names) > 20, r.stdout
    return names, int(getattr(errno, UNIT["SystemCallErrorNumber"][0]))


def seccomp_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` installing the unit's syscall deny list with libseccomp, as systemd
    does (filters survive exec); None when systemd-analyze or libseccomp is missing."""
    lib_name = ctypes.util.find_library("seccomp")
    if shutil.which("systemd-analyze") is None or lib_name is None:
        return None
    names, err = denied_syscalls()
    lib = ctypes.CDLL(lib_name)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                     ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    numbers = [n for n in (lib.seccomp_syscall_resolve_name(x.encode()) for x in names)
               if n >= 0]  # negative: not a call of this architecture
    scmp_act_allow, scmp_act_errno = 0x7FFF0000, 0x00050000 | err

    def install() -> None:
        ctx = lib.seccomp_init(scmp_act_allow)
        for nr in numbers:
            lib.seccomp_rule_add(ctx, scmp_act_errno, nr, 0)
        if lib.seccomp_load(ctx) != 0:
            raise OSError("seccomp_load failed")

    return install

class Service:
    """tierd started the way the unit starts it, on a private data directory and mount."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.mount = tmp / "mnt"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
        for e in UNIT["Environment"]:
            key, _, value = e.partition("=")
            self.env[key] = value
        self.env |= {
            "TIERD_CONFIG": str(SYSTEMD / "tierd.toml"),  # the shipped example file ...
            "TIERD_DATA_DIR": str(tmp / "data"),  # ... with what tierd.env may override
            "TIERD_MOUNT": str(self.mount),
            "TIERD_POOL_SOCKET": str(tmp / "pool.sock"),  # not the host's /run/tierd one
            "TIERD_S3_LISTEN": "127.0.0.1:0",
            "TIERD_ADMIN_LISTEN": "127.0.0.1:0",
            "TIERD_LOG_FORMAT": "text",
        }
        (start,) = UNIT["ExecStart"]
        cmd = expand(start, self.env)
        assert cmd[0] == "/usr/local/bin/tierd"
        cmd[0] = str(BIN / "tierd")  # this checkout's tierd
        self.log = open(tmp / "tierd.log", "wb")  # noqa: SIM115 (closed in stop)
        self.seccomp = seccomp_preexec()
        self.proc = subprocess.Popen(setpriv_prefix() + cmd, env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=self.seccomp)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        endpoints = self.tmp / "data" / "endpoints.json"
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_text()
            try:
                if json.loads(endpoints.read_text())["pid"] == self.proc.pid:
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        raise AssertionError("tierd did not start:\n" + self.log_text())

    def log_text(self) -> str:
        return (self.tmp / "tierd.log").read_text(errors="replace")

    def run(self, key: str, **extra: str) -> subprocess.CompletedProcess[str]:
        (line,) = UNIT[key]
        return subprocess.run(expand(line, self.env | extra), env=self.env | extra,
                              capture_output=True, text=True, timeout=120)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if find_mount(self.mount) is not None:
            unmount(self.mount, lazy=True)
        self.log.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    s = Service(tmp_path)
    try:
        yield s
    finally:
        s.close()


def test_exec_start_mounts_in_the_hosts_namespace_with_the_units_capabilities(
    service: Service,
) -> None:
    info = find_mount(service.mount)
    assert info is not None and info.fstype == "fuse.tierd"  # visible outside the service
    status = Path(f"/proc/{service.proc.pid}/status").read_text()
    bounding = int(re.search(r"CapBnd:\s*([0-9a-f]+)", status).group(1), 16)  # type: ignore[union-attr]
    assert bounding == cap_mask(UNIT["CapabilityBoundingSet"][0].split())
    assert re.search(r"NoNewPrivs:\s*1", status)
    if service.seccomp is not None:  # the unit's SystemCallFilter=, installed as systemd would
        assert re.search(r"Seccomp:\s*2", status)
    bucket = service.mount / "deploytest"
    bucket.mkdir()
    (bucket / "hello.txt").write_bytes(b"through the mount\n" * 1000)
    assert (bucket / "hello.txt").read_bytes() == b"through the mount\n" * 1000


def test_exec_stop_waits_for_tierd_to_unmount_and_exit_cleanly(service: Service) -> None:
    (line,) = UNIT["ExecStop"]
    env = service.env | {"MAINPID": str(service.proc.pid)}
    stop = subprocess.Popen(expand(line, env), env=env)
    # systemd reaps the main process; here the test does, or kill -0 sees a zombie
    assert service.proc.wait(timeout=60) == 0, service.log_text()
    assert stop.wait(timeout=30) == 0
    assert find_mount(service.mount) is None
    assert "stopped cleanly" in service.log_text()
    # ExecStopPost after a clean stop: nothing to unmount, a failure systemd ignores ("-")
    assert UNIT["ExecStopPost"][0].startswith("-")
    assert service.run("ExecStopPost").returncode != 0


def test_exec_stop_post_clears_the_mount_a_killed_tierd_left(service: Service) -> None:
    service.proc.send_signal(signal.SIGKILL)
    service.proc.wait()
    with pytest.raises(OSError) as info:  # (a stat may come from the kernel's cache)
        os.listdir(service.mount / "deploytest")
    assert info.value.errno == errno.ENOTCONN  # what users of a dead mount get
    r = service.run("ExecStopPost")
    assert r.returncode == 0, r.stderr
    assert find_mount(service.mount) is None
    assert service.mount.is_dir() and not any(service.mount.iterdir())


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare is not installed")
def test_why_no_protectsystem_a_slave_mount_namespace_hides_the_mount(tmp_path: Path) -> None:
    """What ProtectSystem=, PrivateTmp=, ReadWritePaths= ... do to a service (systemd.exec(5),
    PrivateMounts=): a new mount namespace, every mount made MS_SLAVE.  tierd mounts fine in
    there, and nobody outside sees it -- the reason the unit has none of those options."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    mnt = tmp_path / "mnt"
    cmd = ["unshare", "--mount", "--propagation", "slave", str(BIN / "tierd"), "serve",
           "--data-dir", str(tmp_path / "data"), "--mount", str(mnt),
           "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]
    with open(tmp_path / "log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "data" / "endpoints.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "log").read_text()
            time.sleep(0.05)
        inside = Path(f"/proc/{proc.pid}/mountinfo").read_text()
        assert f" {mnt} " in inside and "fuse.tierd" in inside  # mounted, in its namespace
        assert find_mount(mnt) is None  # ... and invisible here
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
