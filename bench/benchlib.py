"""What several benchmarks share: admin API calls with the daemon's token, dropping the page
cache, this process's CPU time."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any


def admin_call(url: str, data_dir: Path, method: str, path: str,
               doc: dict[str, Any] | None = None, timeout: float = 600.0) -> Any:
    """``method path`` with ``doc`` as the JSON body, authenticated with the token the
    daemon wrote to ``data_dir/admin-token``; the decoded reply (HTTPError on failure)."""
    token = (data_dir / "admin-token").read_text().strip()
    req = urllib.request.Request(
        url + path, method=method, data=None if doc is None else json.dumps(doc).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body.strip().startswith((b"{", b"[")) else body


def self_cpu() -> float:
    """CPU seconds (user + system) this process has used so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drop_caches() -> bool:
    """Sync and drop the page cache (root only); False when not root (a warm run)."""
    if os.geteuid() != 0:
        return False
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    return True


def idle_state() -> dict[str, str | None]:
    """How this machine's idle CPUs wait: the cpuidle governor, and on a KVM guest the
    haltpoll driver's ``guest_halt_poll_ns`` (0: an idle vCPU halts at once, so every
    wake-up of a process on the other vCPU -- a FUSE request, its reply -- goes through the
    host, ~50 us here: docs/fuse.md, "Round trips on this VM").  None where absent."""
    def read(path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return None
    return {"cpuidle_governor": read("/sys/devices/system/cpu/cpuidle/current_governor"),
            "guest_halt_poll_ns": read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")}


def ipis() -> dict[str, int]:
    """Inter-processor interrupts so far, over all CPUs (``/proc/interrupts``): ``RES``
    (rescheduling) and ``CAL`` (function calls: the scheduler's remote wake-ups).  Every
    wake-up of a process whose CPU has gone idle costs one; on a VM each is an exit to the
    host, and that is what a FUSE round trip costs here beyond the work on each side
    (docs/fuse.md, "Wake-ups between CPUs, counted").  Empty where the file lacks them."""
    out: dict[str, int] = {}
    try:
        with open("/proc/interrupts") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    ncpu = len(lines[0].split()) if lines else 0
    for line in lines[1:]:
        fields = line.split()
        if fields and fields[0] in ("RES:", "CAL:"):
            out[fields[0][:-1]] = sum(int(x) for x in fields[1:1 + ncpu] if x.isdigit())
    return out


def hot_fs(path: Path) -> dict[str, Any]:
    """The file system under ``path`` (:func:`tierd_fuse.mount.find_mount` of the nearest
    mount point): its type, device, mount options and, for ext4,
    whether it has a journal.  Without one (``journal_task`` reads ``<none>``), ext4 passes
    over every inode freed in the last minute (six while its table block is dirty) at each
    new file (``recently_deleted`` in its inode allocator), so new files cost ~20 us or
    ~400 us depending on how many were deleted just before: docs/fuse.md, "The hot tier's
    file system without a journal".  Figures from such a file system are not comparable
    with others unless this is the same."""
    from tierd_fuse.mount import find_mount  # (the daemon's own mountinfo reader)

    point = path.resolve()
    while not os.path.ismount(point):
        point = point.parent
    m = find_mount(point)
    if m is None:
        return {}
    out: dict[str, Any] = {"mount": m.mountpoint, "fstype": m.fstype, "source": m.source,
                           "options": m.options}
    if m.fstype == "ext4":
        try:
            task = Path(f"/sys/fs/ext4/{Path(m.source).name}/journal_task").read_text().strip()
            out["journal"] = task != "<none>"
        except OSError:
            out["journal"] = None
    return out


def emit(result: dict[str, Any], out: Path | None) -> None:
    """Print a benchmark's JSON document, and write it to ``out`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


def wait_mounted(proc: subprocess.Popen[bytes], mnt: Path, log: Path, name: str) -> None:
    """Wait (30 s at most) until a peer's FUSE daemon ``proc`` has mounted ``mnt``; its
    ``log`` is the error if it exits first."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if f" {mnt} " in Path("/proc/self/mountinfo").read_text():
            return
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} did not mount in 30 s")


def stop_mounted(proc: subprocess.Popen[bytes], mnt: Path) -> None:
    """Unmount a peer's FUSE mount and stop its daemon."""
    subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, timeout=60)
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
