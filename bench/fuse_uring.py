"""The floor of a create over FUSE's two transports: ``/dev/fuse`` and FUSE over io_uring.

Why: on this VM a create through tierd's door costs ~7 wake-ups that cross CPUs, each an
exit to the host (docs/fuse.md, "Wake-ups between CPUs, counted"), and moving the request
loop beside its caller from inside the daemon did not hold.  FUSE over io_uring (kernel
6.14+) has one request queue per CPU: the kernel puts a request on the queue of the CPU its
caller runs on, and a thread that serves that queue from the same CPU is woken without an
interrupt.  ``bench/fuse_null_uring.c`` speaks the kernel protocol itself over handlers that
do nothing (no libfuse, no Python), so each transport is measured with the same code:

* ``dev``: one thread, ``read`` and ``writev`` on ``/dev/fuse`` (tierd's kernel backend's
  transport);
* ``uring``: a thread per CPU, each pinned to its CPU and serving that CPU's queue;
* ``uring_unpinned``: the same threads, not pinned;
* ``uring_one_thread``: one thread serving every queue through one ring (what a single event
  loop could do);
* ``python_dev``, ``python_uring``, ``python_uring_one_thread``: the same three in Python
  (``bench/fuse_null_uring.py`` over :mod:`tierd_fuse.kuring`), the interpreter lock
  included.

Each round runs every transport in turn (5,000 ``open(O_CREAT)`` + ``close`` from one
process, the client of ``bench/fuse_null.py``), with the machine's inter-processor
interrupts per create (:func:`benchlib.ipis`) and how many requests each path answered
(``served``: ``/dev/fuse`` and each queue), so a run where the ring did not take the
requests shows as such.  The fuse module's ``enable_uring`` is switched on for the run and
set back after; where the kernel has no FUSE over io_uring only the ``dev`` transports run.

``--passthrough`` adds the C daemon's creates as passthrough opens (``dev_passthrough``,
``uring_passthrough``): each CREATE registers a file made ahead by a second thread with the
kernel and answers ``FOPEN_PASSTHROUGH``, each RELEASE closes it, as tierd's creates with
write passthrough do -- the floor of such a create without tierd's namespace.

Usage (root: mount(2) and the module parameter):
``python bench/fuse_uring.py [--files 5000] [--rounds 3] [--passthrough] [--only MODE...]``
(``--only`` may name passthrough transports without ``--passthrough``); prints one JSON
document.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchlib import idle_state, ipis, wait_mounted
from fuse_null import CLIENT
from tierd_fuse import kuring

SOURCE = Path(__file__).with_name("fuse_null_uring.c")
ENABLE = kuring.ENABLE
PY_SERVER = Path(__file__).with_name("fuse_null_uring.py")
#: transport -> (the daemon, its argument, its environment); "python": the same handlers in
#: Python (bench/fuse_null_uring.py, tierd_fuse.kuring)
MODES: dict[str, tuple[str, str, dict[str, str]]] = {
    "dev": ("c", "dev", {}),
    "uring": ("c", "uring", {}),
    "uring_unpinned": ("c", "uring", {"FUSE_NULL_URING_NOPIN": "1"}),
    "uring_one_thread": ("c", "uring-one", {}),
    "python_dev": ("python", "dev", {}),
    "python_uring": ("python", "uring", {}),
    "python_uring_one_thread": ("python", "uring-one", {}),
}
#: with ``--passthrough``: the C daemon's creates as passthrough opens of files it made
#: ahead (``FUSE_NULL_BACKING``: a fresh directory per run, on TMPDIR's file system), as
#: tierd's creates with write passthrough are
PASSTHROUGH_MODES: dict[str, tuple[str, str, dict[str, str]]] = {
    "dev_passthrough": ("c", "dev", {"FUSE_NULL_BACKING": ""}),
    "uring_passthrough": ("c", "uring", {"FUSE_NULL_BACKING": ""}),
}


def build(tmp: Path) -> Path:
    exe = tmp / "fuse_null_uring"
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(exe), str(SOURCE)], check=True)
    return exe


@contextmanager
def uring_enabled() -> Iterator[str | None]:
    """The fuse module's ``enable_uring`` on while inside, as it was after; yields why not
    where it cannot be (no FUSE over io_uring in this kernel, not root), else None."""
    try:
        old = ENABLE.read_text().strip()
    except OSError as e:
        yield f"no {ENABLE} ({e.strerror}): this kernel has no FUSE over io_uring"
        return
    try:  # (kernel.io_uring_disabled, a seccomp filter: no ring at all)
        kuring.Ring(-1, 2).close()
    except OSError as e:
        yield f"io_uring is not available here ({e.strerror})"
        return
    try:
        if old != "Y":
            ENABLE.write_text("Y")
    except OSError as e:
        yield f"{ENABLE} cannot be set ({e.strerror})"
        return
    try:
        yield None
    finally:
        if old != "Y":
            ENABLE.write_text(old)


def served(log: str) -> dict[str, Any]:
    """The C daemon's count of requests per path (its last stderr line)."""
    m = re.search(r"served: /dev/fuse (\d+)((?:, queue \d+ \d+)*)(?:, passthrough (\d+))?",
                  log)
    if m is None:
        return {}
    queues = [int(n) for n in re.findall(r"queue \d+ (\d+)", m.group(2))]
    out: dict[str, Any] = {"dev": int(m.group(1)), "queues": queues}
    if m.group(3) is not None:  # the creates answered as passthrough opens
        out["passthrough"] = int(m.group(3))
    return out


def one_run(exe: Path, tmp: Path, mode: str, files: int) -> dict[str, Any]:
    daemon, arg, extra = {**MODES, **PASSTHROUGH_MODES}[mode]
    mnt = tmp / f"mnt-{mode}"
    mnt.mkdir(exist_ok=True)
    if "FUSE_NULL_BACKING" in extra:  # (removed with tmp, after the last round)
        extra = {**extra, "FUSE_NULL_BACKING": tempfile.mkdtemp(prefix="backing-", dir=tmp)}
    log = tmp / f"{mode}.log"
    cmd = [str(exe)] if daemon == "c" else [sys.executable, str(PY_SERVER)]
    with open(log, "wb") as out:
        proc = subprocess.Popen([*cmd, str(mnt), arg], stdout=out, stderr=out,
                                env={**os.environ, **extra})
    try:
        wait_mounted(proc, mnt, log, "fuse_null_uring")
        irq0 = ipis()
        try:
            r = subprocess.run([sys.executable, "-c", CLIENT, "create", str(mnt), str(files)],
                               capture_output=True, text=True, check=True,
                               timeout=60 + files / 100)
        except subprocess.TimeoutExpired:  # a daemon that stopped answering: its log says why
            proc.kill()  # (the kernel ends the client's requests when the device closes)
            raise RuntimeError(f"{mode}: no answer\n{log.read_text()[-3000:]}") from None
        irq1 = ipis()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    res: dict[str, Any] = json.loads(r.stdout)
    res["per_s"] = round(res["per_s"])
    res["ipis_per_create"] = {k: round((irq1[k] - irq0.get(k, 0)) / files, 2) for k in irq1}
    res["served"] = served(log.read_text())
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passthrough", action="store_true",
                    help="also the C daemon's creates as passthrough opens (dev_passthrough, "
                    "uring_passthrough)")
    ap.add_argument("--only", nargs="+", metavar="MODE",
                    help="run only these transports, passthrough ones included (names as "
                    "in the JSON)")
    args = ap.parse_args()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tierd-uring-") as t, uring_enabled() as why:
        tmp = Path(t)
        exe = build(tmp)
        every = {**MODES, **PASSTHROUGH_MODES}
        if unknown := set(args.only or ()) - set(every):
            sys.exit(f"--only: no transport {', '.join(sorted(unknown))}")
        chosen = args.only or [m for m in every
                               if args.passthrough or m not in PASSTHROUGH_MODES]
        modes = [m for m in every if m in chosen and (not why or every[m][1] == "dev")]
        for _ in range(args.rounds):
            rounds.append({m: one_run(exe, tmp, m, args.files) for m in modes})
    doc: dict[str, Any] = {
        "bench": "fuse_uring", "files": args.files, "kernel": os.uname().release,
        "uring": why or "on", "rounds": rounds,
        "median_creates_per_s": {m: statistics.median(r[m]["per_s"] for r in rounds)
                                 for m in rounds[0]} if rounds else {},
        "load_average": os.getloadavg(), "idle": idle_state(),
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
