"""Crash torture: concurrent S3 and FUSE writers, SIGKILL at random moments, restart, verify.

    .venv/bin/python bench/torture.py --cycles 200 --cold s3 --seed 1 --out torture.json

One ``tierd serve`` with a FUSE mount (:mod:`torture_daemon`; ``--rev`` runs it from a
``git archive`` of one commit) runs on a data directory kept across cycles.  Each
cycle starts writer threads (:mod:`torture_writers`: S3 PUTs small and multi-MB, multipart,
overwrites, deletes, CopyObject; FUSE create/in-place write + fsync, rename over + directory
fsync, O_APPEND, O_TRUNC, unlink), kills the daemon with SIGKILL after a random time (or, for
a share of the kills, 0-20 ms after a mutating S3 request went out, or just after a rename,
unlink or ``open(O_TRUNC)`` returned), lazily unmounts the dead mount, starts the daemon again
on the same data directory and checks (:mod:`torture_model`, :mod:`torture_verify`):

* every key holds its last acknowledged content or the outcome of the operation in flight at
  the kill, through S3 and through the mount, and both doors agree; reads never hang, are
  never cut off and never show zeros the content does not have;
* deleted keys stay deleted: in both listings (taken twice, the second after ``import_ttl``
  so they re-list the cold store), and on lookups (HEAD, stat) that could import from cold;
* S3's ETag is the MD5 of the bytes (single part) or the multipart ETag, in GET and listing;
* after the admin API's persist job (``tierctl persist --wait``) the cold store -- read
  directly: the ``file://`` directory or the moto bucket -- holds exactly the live keys with
  their bytes; and, every ``--evict-every`` cycles, after evicting everything the doors serve
  the same bytes again, now from cold.

A key found in a wrong state is reported once, then deleted through S3 (or quarantined when
that fails too) so one loss is not reported again every cycle.  The result (``--out``) is
JSON: cycles, operations acknowledged per kind, kills per kind, violations (each with the
key's last operations and daemon log lines), durations, versions, ``nproc``.  The journal of
acknowledged operations (key, op, seq, size, MD5) is ``WORK/journal.jsonl``; daemon logs are
``WORK/logs/`` (those of cycles without violations are removed unless ``--keep-logs``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(HERE))

import boto3  # noqa: E402
from meta.pg_server import PgServer, find_bindir  # noqa: E402
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer  # noqa: E402
from torture_daemon import (  # noqa: E402
    ROOT_KEY,
    ROOT_SECRET,
    StartFailed,
    Tierd,
    s3_client,
    snapshot,
)
from torture_model import (  # noqa: E402
    LASTING,
    Journal,
    Seen,
    Violation,
    absent,
    check_agree,
    check_cold,
    check_listing,
    check_read,
    iso,
)
from torture_verify import Doors, bounded, cold_file, cold_s3  # noqa: E402
from torture_writers import (  # noqa: E402
    FuseWriter,
    Killer,
    S3Writer,
    Writer,
    fsync_dir,
    s3_kill_hook,
)

#: the harness's own tierd version (the daemon may run another tree: see --rev)
__version__ = re.search(r'__version__ = "([^"]+)"',
                        (REPO / "tierd" / "__init__.py").read_text()).group(1)  # type: ignore[union-attr]
BUCKET = "torture"
COLD_BUCKET = "tierd-cold"
VERSIONS_DIR = ".tierd-versions/"  # a versioned bucket's noncurrent objects in cold


def same_as_listed(key: str, cycle: int, views: dict[str, Seen],
                   s3_list: dict[str, tuple[int, str]],
                   fuse_list: dict[str, int]) -> list[Violation]:
    """Each door's listing agrees with its own read: the size (both), the ETag (S3)."""
    out: list[Violation] = []
    s3, fuse = views["s3"], views["fuse"]
    listed = s3_list.get(key)
    if listed is not None and s3.data is not None and listed[0] != len(s3.data):
        out.append(Violation("listing-size", key, "s3-list", cycle, len(s3.data), listed[0],
                             "the listing's size is not that of GET's bytes"))
    if listed is not None and s3.etag is not None and listed[1] != s3.etag:
        out.append(Violation("listing-etag", key, "s3-list", cycle, s3.etag, listed[1],
                             "the listing's ETag is not GET's"))
    size = fuse_list.get(key)
    if size is not None and fuse.data is not None and size != len(fuse.data):
        out.append(Violation("listing-size", key, "fuse-list", cycle, len(fuse.data), size,
                             "stat's size is not that of the bytes read"))
    return out


class Torture:
    """The whole run: setup, cycles, the result document."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="tierd-torture-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.journal = Journal()
        self.violations: list[Violation] = []
        self.kills: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.error_samples: list[str] = []
        self.times: defaultdict[str, float] = defaultdict(float)
        self.moto: MotoServer | None = None
        self.pg: PgServer | None = None
        self.cold_prefix = f"run-{args.seed}-{os.getpid()}"
        self.killer: Killer | None = None
        self.cycles_done = 0
        farm, self.commit = None, ""
        if args.rev:
            farm, self.commit = snapshot(args.rev, self.work)
        self.tierd = Tierd(self.work, self.daemon_args(), farm)
        self.s3: Any = None
        self.writer_keys: dict[str, list[str]] = {}
        #: wall-clock times of this cycle's kill and of the daemon ready again (for reports)
        self.kill_wall = self.ready_wall = 0.0
        self.kill_how = ""
        #: lasting wrong states reported already (a cold object, an ETag): (kind, key, seen)
        self.reported: set[tuple[str, str, str]] = set()
        #: daemon logs kept for the report (those naming a violation)
        self.keep_logs: set[Path] = set()

    # -- setup -----------------------------------------------------------------------------

    def daemon_args(self) -> list[str]:
        a = self.args
        extra = ["--persist-delay", str(a.persist_delay), "--import-ttl", str(a.import_ttl),
                 "--s3-min-part-size", "64KiB", "--log-level", a.log_level]
        if a.pg:
            # the metadata in a real PostgreSQL server (fsync on: the kills are of the
            # daemon, and the server's acknowledged commits are what must survive), the
            # daemon a named node of a cluster of one (per-node records, homes, peer door)
            bindir = find_bindir()
            if bindir is None:
                raise SystemExit("--pg: PostgreSQL is not installed")
            self.pg = PgServer(bindir, fsync=True)
            extra += ["--meta-url", self.pg.url(f"torture-{a.seed}"), "--node-name", "n1",
                      "--peer-listen", "127.0.0.1:0",
                      "--cluster-secret", "torture-cluster-secret"]
        if a.cold == "file":
            return [*extra, "--cold-url", f"file://{self.work / 'cold'}"]
        self.moto = MotoServer().start()
        self.moto.client().create_bucket(Bucket=COLD_BUCKET)
        return [*extra, "--cold-url", f"s3://{COLD_BUCKET}/{self.cold_prefix}",
                "--cold-s3-endpoint", self.moto.url, "--cold-s3-access-key", ACCESS_KEY,
                "--cold-s3-secret-key", SECRET_KEY, "--cold-s3-region", REGION,
                "--cold-s3-addressing", "path", "--cold-s3-max-attempts", "2"]

    def setup(self) -> None:
        """First start: the bucket and the FUSE writers' directories, fsynced."""
        self.tierd.start("start-000")
        self.s3 = s3_client(self.tierd.s3_url, ROOT_KEY, ROOT_SECRET, self.args.read_timeout)
        self.s3.meta.events.register("before-send.s3", s3_kill_hook(lambda: self.killer))
        root = self.tierd.mnt / BUCKET
        root.mkdir()
        fsync_dir(self.tierd.mnt)
        if self.args.versioned:
            # every overwrite and delete then keeps the old version (H records instead of
            # G keys, noncurrent objects under .tierd-versions/ in the cold store)
            self.s3.put_bucket_versioning(Bucket=BUCKET,
                                          VersioningConfiguration={"Status": "Enabled"})
        a = self.args
        for i in range(a.s3_writers):
            self.writer_keys[f"s3-{i}"] = [f"s3/w{i}/k{j}" for j in range(a.keys)]
        for i in range(a.fuse_writers):
            d = root / "f" / f"w{i}"
            d.mkdir(parents=True)
            fsync_dir(d.parent)
            fsync_dir(root)
            keys = [f"f/w{i}/k{j}" for j in range(a.keys)]
            self.writer_keys[f"fuse-{i}"] = keys
            for k in keys:
                self.journal.key(k + ".tmp", f"fuse-{i}")
        for owner, keys in self.writer_keys.items():
            for k in keys:
                self.journal.key(k, owner)

    # -- one cycle -------------------------------------------------------------------------

    def writers(self, killer: Killer, stop: threading.Event, cycle: int) -> list[Writer]:
        out: list[Writer] = []
        for owner, keys in self.writer_keys.items():
            seed = random.Random(f"{self.args.seed}/{cycle}/{owner}").getrandbits(32)
            if owner.startswith("s3-"):
                out.append(S3Writer(owner, self.journal, keys, killer, stop, seed, self.s3,
                                    BUCKET, self.args.large << 20))
            else:
                out.append(FuseWriter(owner, self.journal, keys, killer, stop, seed,
                                      self.tierd.mnt / BUCKET))
        return out

    def write_and_kill(self, cycle: int) -> None:
        """Writers run; SIGKILL at a random time or armed kill point; wait for the dead."""
        assert self.tierd.proc is not None
        a = self.args
        killer = self.killer = Killer(self.tierd.proc, self.rng.getrandbits(32))
        stop = threading.Event()
        writers = self.writers(killer, stop, cycle)
        t0 = time.monotonic()
        for w in writers:
            w.start()
        duration = self.rng.uniform(a.min_run, a.max_run)
        r = self.rng.random()
        point = ("s3-send" if r < a.s3_send_kills and a.s3_writers else
                 "fuse-ns" if r < a.s3_send_kills + a.fuse_op_kills and a.fuse_writers
                 else None)
        time.sleep(duration)
        if point is not None:
            killer.arm(point)
            killer.fired.wait(3.0)  # a writer passes the point soon; else a timed kill
        killer.kill(f"timer@{time.monotonic() - t0:.2f}s")
        self.tierd.proc.wait(30)
        stop.set()
        self.kills[killer.how.split("@")[0].split("+")[0]] += 1
        for w in writers:
            w.join(60)
            if w.is_alive():
                self.note(Violation("writer-stuck", w.name, w.kind, cycle, None, None,
                                    "a writer did not return within 60 s of the kill"))
            for why, n in w.errors.items():
                self.errors[f"{w.kind} {why}"] += n
            self.error_samples.extend(w.samples[:max(0, 20 - len(self.error_samples))])
        self.killer = None
        self.kill_wall, self.kill_how = killer.wall, killer.how
        self.times["write_s"] += time.monotonic() - t0
        self.tierd.unmount()

    def restart(self, cycle: int) -> bool:
        t0 = time.monotonic()
        try:
            self.tierd.start(f"cycle-{cycle:04d}")
        except (StartFailed, OSError) as e:
            tail = self.tierd.log_lines()[-30:]
            self.note(Violation("restart-failed", "*", "daemon", cycle, "a running daemon",
                                str(e), "the daemon did not start after the kill", log=tail))
            return False
        self.times["restart_s"] += time.monotonic() - t0
        self.ready_wall = time.time()
        return True

    # -- checks ----------------------------------------------------------------------------

    def note(self, v: Violation, prev_log: Path | None = None) -> bool:
        """Record a violation with the key's operations and the log lines naming it; False
        for a lasting one (an ETag, a cold object) reported before in the same state."""
        if v.kind in LASTING or v.kind.startswith("cold-"):
            what = (v.kind, v.key, json.dumps(v.seen, sort_keys=True, default=str))
            if what in self.reported:
                return False
            self.reported.add(what)
        rec = self.journal.records.get(v.key)
        v.kill = v.kill or self.kill_how
        if isinstance(v.seen, dict) and "written" in v.seen and self.kill_wall:
            v.detail += (f"; the object was written at {v.seen['written']} (kill "
                         f"{iso(self.kill_wall)}, daemon ready again {iso(self.ready_wall)})")
        self.keep_logs.update(p for p in (prev_log, self.tierd.log_path) if p is not None)
        if rec is not None and not v.ops:
            v.ops = rec.ops_doc()
        if not v.log:
            lines: list[str] = []
            for path in (prev_log, self.tierd.log_path):
                if path is not None:
                    lines += [f"{path.name}: {ln}" for ln in self.tierd.log_lines(path)
                              if v.key in ln][-6:]
            lines += [f"{self.tierd.log_path.name}: {ln}" for ln in self.tierd.log_lines()
                      if "level=warning" in ln or "level=error" in ln
                      or "level=critical" in ln][-8:]
            v.log = lines
        self.violations.append(v)
        print(f"VIOLATION cycle {v.cycle}: {v.kind} {v.door} {v.key}: {v.detail}",
              file=sys.stderr, flush=True)
        return True

    def verify(self, cycle: int, prev_log: Path) -> None:
        t0 = time.monotonic()
        doors = Doors(self.s3, BUCKET, self.tierd.mnt / BUCKET, self.args.read_timeout)
        ignore = {r.key for r in self.journal.records.values() if r.quarantined}
        found: list[Violation] = []
        s3_list, fuse_list = self.listings(doors, cycle, found)
        live = self.journal.live()
        found += check_listing(live, "s3-list", {k: s for k, (s, _) in s3_list.items()
                                                 if k not in ignore}, cycle)
        found += check_listing(live, "fuse-list", {k: s for k, s in fuse_list.items()
                                                   if k not in ignore}, cycle)
        broken: set[str] = set()
        for rec in live:
            views = {"s3": doors.s3_get(rec.key), "fuse": doors.fuse_read(rec.key)}
            v_s3, bad = check_read(rec, "s3", views["s3"], cycle)
            v_fuse, bad_fuse = check_read(rec, "fuse", views["fuse"], cycle, check_etag=False)
            bad += bad_fuse + check_agree(rec.key, cycle, views)
            bad += same_as_listed(rec.key, cycle, views, s3_list, fuse_list)
            found += bad
            if v_s3 is None or v_fuse is None or any(v.kind not in LASTING for v in bad):
                broken.add(rec.key)
            else:
                self.journal.settle(rec.key, v_s3)
        for v in found:
            self.note(v, prev_log)
            if v.kind not in LASTING:
                broken.add(v.key)
        for key in sorted(broken & set(self.journal.records)):
            self.repair(doors, key, cycle)
        self.lookups(doors, cycle, prev_log)
        self.times["verify_s"] += time.monotonic() - t0

    def listings(self, doors: Doors, cycle: int, found: list[Violation]
                 ) -> tuple[dict[str, tuple[int, str]], dict[str, int]]:
        s3_list: dict[str, tuple[int, str]] = {}
        fuse_list: dict[str, int] = {}
        try:
            s3_list = doors.s3_list()
        except Exception as e:
            found.append(Violation("listing-error", "*", "s3-list", cycle, None, repr(e)))
        try:
            fuse_list = doors.fuse_list()
        except Exception as e:
            found.append(Violation("listing-error", "*", "fuse-list", cycle, None, repr(e)))
        return s3_list, fuse_list

    def lookups(self, doors: Doors, cycle: int, prev_log: Path) -> None:
        """After ``import_ttl``: listings again and a lookup of every deleted key through
        both doors (each may import from cold): nothing deleted comes back."""
        time.sleep(self.args.import_ttl + 0.2)
        live = self.journal.live()
        ignore = {r.key for r in self.journal.records.values() if r.quarantined}
        found: list[Violation] = []
        s3_list, fuse_list = self.listings(doors, cycle, found)
        found += check_listing(live, "s3-list-again", {k: s for k, (s, _) in s3_list.items()
                                                       if k not in ignore}, cycle)
        found += check_listing(live, "fuse-list-again", {k: s for k, s in fuse_list.items()
                                                         if k not in ignore}, cycle)
        for rec in live:
            if rec.acked.present:
                continue
            for door, seen in (("s3-head", doors.s3_head(rec.key)),
                               ("fuse-stat", doors.fuse_stat(rec.key))):
                found += check_read(rec, door, seen, cycle, check_etag=False)[1]
        for v in found:
            self.note(v, prev_log)
        for key in sorted({v.key for v in found} & set(self.journal.records)):
            self.repair(doors, key, cycle)

    def repair(self, doors: Doors, key: str, cycle: int) -> None:
        """Delete a key found wrong (so the loss is reported once) and check it is gone;
        quarantine it when even that fails."""
        try:
            bounded(lambda: self.s3.delete_object(Bucket=BUCKET, Key=key),
                    self.args.read_timeout)
            gone = not doors.s3_head(key).present and not doors.fuse_stat(key).present
        except Exception as e:
            gone = False
            why = f"delete failed: {e!r}"
        else:
            why = "still there after a DELETE"
        if gone:
            self.journal.ack(key, absent("repair", self.journal.next_seq(), cycle))
        else:
            self.journal.quarantine(key, f"cycle {cycle}: {why}")

    def persist_and_check_cold(self, cycle: int, prev_log: Path) -> None:
        t0 = time.monotonic()
        timeout = self.args.persist_timeout
        try:
            job = self.tierd.admin("POST", "/v1/jobs", {"kind": "persist", "prefix": "",
                                                       "timeout": timeout})
            deadline = time.monotonic() + timeout + 15
            while job["state"] in ("queued", "running") and time.monotonic() < deadline:
                time.sleep(0.2)
                job = self.tierd.admin("GET", f"/v1/jobs/{job['id']}")
        except Exception as e:
            job = {"state": "failed", "error": repr(e)}
        self.times["persist_s"] += time.monotonic() - t0
        if job["state"] != "done":
            try:
                placement = self.tierd.admin("GET", "/v1/status")["placement"]
            except Exception as e:
                placement = repr(e)
            self.note(Violation("persist-failed", "*", "admin", cycle, "done",
                                {"job": job, "status.placement": placement},
                                str(job.get("error"))), prev_log)
            return
        t0 = time.monotonic()
        cold = self.read_cold()
        ignore = frozenset(r.key for r in self.journal.records.values() if r.quarantined)
        stale: list[str] = []
        wrong: list[str] = []
        for v in check_cold(self.journal.live(), cold, cycle, ignore):
            if self.note(v, prev_log) and v.kind == "cold-resurrectable":
                stale.append(v.key)
            elif v.kind != "cold-extra":
                wrong.append(v.key)
        if stale:
            self.resurrection_after_persist(stale, cycle, prev_log)
        if self.args.evict_every and cycle % self.args.evict_every == 0:
            self.evict_and_reread(cycle, prev_log)
        elif wrong:  # what a reader gets once the local copy is gone
            self.evict_and_reread(cycle, prev_log, wrong)
        self.times["cold_s"] += time.monotonic() - t0

    def resurrection_after_persist(self, keys: list[str], cycle: int, prev_log: Path) -> None:
        """Deleted keys' stale objects in cold: once ``import_ttl`` passed, does a lookup
        import them?  (An object nobody wrote, ``cold-extra``, is imported by design.)"""
        doors = Doors(self.s3, BUCKET, self.tierd.mnt / BUCKET, self.args.read_timeout)
        time.sleep(self.args.import_ttl + 0.2)
        for key in keys:
            rec = self.journal.records.get(key)
            for door, seen in (("s3-head-after-persist", doors.s3_head(key)),
                               ("fuse-stat-after-persist", doors.fuse_stat(key))):
                if seen.present:
                    self.note(Violation("resurrected", key, door, cycle,
                                        rec.acked.describe() if rec else None,
                                        seen.describe(), "a deleted key came back from a "
                                        "stale object in the cold store"), prev_log)
            if rec is not None:
                self.repair(doors, key, cycle)

    def read_cold(self) -> dict[str, Seen]:
        """The cold store's current objects of the bucket (noncurrent versions, kept under
        ``.tierd-versions/`` in a versioned bucket, are not live keys)."""
        if self.moto is None:
            seen = cold_file(self.work / "cold", BUCKET)
        else:
            seen = cold_s3(self.moto.client(), COLD_BUCKET, self.cold_prefix, BUCKET)
        return {k: v for k, v in seen.items() if not k.startswith(VERSIONS_DIR)}

    def evict_and_reread(self, cycle: int, prev_log: Path,
                         keys: list[str] | None = None) -> None:
        """Every block (of ``keys``, default all) off the local tiers, then read again:
        from cold now."""
        for prefix in [f"{BUCKET}/{k}" for k in keys] if keys else [BUCKET + "/"]:
            self.tierd.admin("POST", "/v1/placement/evict", {"prefix": prefix, "tier": "all"})
        doors = Doors(self.s3, BUCKET, self.tierd.mnt / BUCKET, self.args.read_timeout)
        for rec in self.journal.live():
            if keys and rec.key not in keys:
                continue
            views = {"s3": doors.s3_get(rec.key), "fuse": doors.fuse_read(rec.key)}
            bad = check_read(rec, "s3-evicted", views["s3"], cycle)[1]
            bad += check_read(rec, "fuse-evicted", views["fuse"], cycle, check_etag=False)[1]
            bad += check_agree(rec.key, cycle, views)
            for v in bad:
                self.note(v, prev_log)
            if bad:
                self.repair(doors, rec.key, cycle)

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        a = self.args
        t_start = time.monotonic()
        try:
            self.setup()
            for cycle in range(1, a.cycles + 1):
                self.journal.cycle = cycle
                prev_log = self.tierd.log_path
                self.write_and_kill(cycle)
                if not self.restart(cycle):
                    break
                self.verify(cycle, prev_log)
                if a.cold_every and cycle % a.cold_every == 0:
                    self.persist_and_check_cold(cycle, prev_log)
                self.cycles_done = cycle
                self.flush_journal()
                if a.out is not None:  # a long run's figures so far, should it be cut short
                    a.out.write_text(json.dumps(self.result(time.monotonic() - t_start),
                                                indent=2, default=str) + "\n")
                if prev_log not in self.keep_logs and not a.keep_logs:
                    prev_log.unlink(missing_ok=True)
                if a.progress:
                    print(f"cycle {cycle}: {sum(self.journal.acked_ops.values())} acked ops, "
                          f"{len(self.violations)} violations, "
                          f"{time.monotonic() - t_start:.0f} s", file=sys.stderr, flush=True)
                if a.max_violations and len(self.violations) >= a.max_violations:
                    break
        finally:
            self.tierd.stop()
            if self.moto is not None:
                self.moto.close()
            if self.pg is not None:
                self.pg.stop()
        return self.result(time.monotonic() - t_start)

    def tierd_version(self) -> str:
        """The daemon's version and commit (``--rev``), or the working tree's HEAD."""
        if self.commit:
            return f"{__version__} (commit {self.commit})"
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        return f"{__version__} (working tree of {REPO}, HEAD {head})"

    def flush_journal(self) -> None:
        entries, self.journal.entries = self.journal.entries, []
        with open(self.work / "journal.jsonl", "a") as f:
            for e in entries:
                f.write(json.dumps(e) + "\n")

    def result(self, total: float) -> dict[str, Any]:
        import botocore
        import moto

        n = max(1, self.cycles_done)
        kinds = Counter(v.kind for v in self.violations)
        return {
            "command": [sys.executable, *sys.argv],
            "cold": self.args.cold, "seed": self.args.seed, "versioned": self.args.versioned,
            "engine": "postgresql (node n1)" if self.args.pg else "lmdb",
            "cycles": self.cycles_done, "kills": dict(self.kills),
            "ops_acknowledged": dict(sorted(self.journal.acked_ops.items())),
            "ops_acknowledged_total": sum(self.journal.acked_ops.values()),
            "violations_total": len(self.violations),
            "violations_by_kind": dict(sorted(kinds.items())),
            "violations": [v.as_dict() for v in self.violations],
            "quarantined": {r.key: r.quarantined for r in self.journal.records.values()
                            if r.quarantined},
            "errors_while_alive": dict(self.errors.most_common()),
            "error_samples": self.error_samples,
            "durations": {"total_s": round(total, 1),
                          "per_cycle_s": round(total / n, 2),
                          "cycles_per_minute": round(60 * self.cycles_done / total, 2),
                          **{k: round(v, 1) for k, v in self.times.items()}},
            "settings": {k: v for k, v in vars(self.args).items() if k != "out"},
            "versions": {"tierd": self.tierd_version(), "python": platform.python_version(),
                         "boto3": boto3.__version__, "botocore": botocore.__version__,
                         "moto": moto.__version__, "kernel": platform.release()},
            "nproc": os.cpu_count(),
            "work_dir": str(self.work),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--cycles", type=int, default=20, help="kill/restart cycles")
    p.add_argument("--cold", choices=("file", "s3"), default="file",
                   help="cold store: a file:// directory or a moto server (s3://)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pg", action="store_true",
                   help="metadata in a PostgreSQL server the run starts, as node n1 of a "
                        "cluster (default: lmdb, a single node)")
    p.add_argument("--versioned", action="store_true",
                   help="enable versioning on the bucket (every overwrite keeps a version)")
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: stdout)")
    p.add_argument("--work-dir", default=None, help="data, mount, logs, journal "
                   "(default: a new temporary directory, removed after a clean run)")
    p.add_argument("--rev", default=None,
                   help="run the daemon from this git revision (a `git archive` snapshot "
                   "in WORK/src) instead of the installed working tree")
    p.add_argument("--min-run", type=float, default=1.0, help="shortest write phase, s")
    p.add_argument("--max-run", type=float, default=4.0, help="longest write phase, s")
    p.add_argument("--s3-writers", type=int, default=3, help="S3 writer threads")
    p.add_argument("--fuse-writers", type=int, default=3, help="FUSE writer threads")
    p.add_argument("--keys", type=int, default=8, help="keys per writer")
    p.add_argument("--large", type=int, default=4, help="largest S3 PUT, MiB (0: none)")
    p.add_argument("--s3-send-kills", type=float, default=0.1,
                   help="share of kills 0-20 ms after a mutating S3 request went out")
    p.add_argument("--fuse-op-kills", type=float, default=0.2,
                   help="share of kills 0-5 ms after a rename, unlink or open(O_TRUNC) "
                   "returned, the writer stopped there (before its fsyncs)")
    p.add_argument("--persist-delay", type=float, default=0.0, help="daemon setting")
    p.add_argument("--import-ttl", type=int, default=1, help="daemon setting")
    p.add_argument("--log-level", default="info", help="daemon setting")
    p.add_argument("--cold-every", type=int, default=1,
                   help="persist + cold check every N cycles (0: never)")
    p.add_argument("--evict-every", type=int, default=3,
                   help="evict everything and read again every N cycles (with a cold check)")
    p.add_argument("--persist-timeout", type=float, default=60.0)
    p.add_argument("--read-timeout", type=float, default=15.0,
                   help="a read taking longer is a hang")
    p.add_argument("--max-violations", type=int, default=0, help="stop after N (0: never)")
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--progress", action="store_true", help="a line per cycle on stderr")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t = Torture(args)
    doc = t.run()
    text = json.dumps(doc, indent=2, default=str) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    if args.work_dir is None and not doc["violations"]:
        shutil.rmtree(t.work, ignore_errors=True)
    print(f"{doc['cycles']} cycles, {doc['ops_acknowledged_total']} acknowledged ops, "
          f"{doc['violations_total']} violations {doc['violations_by_kind']}, "
          f"{doc['durations']['cycles_per_minute']} cycles/min", file=sys.stderr)
    return 1 if doc["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
