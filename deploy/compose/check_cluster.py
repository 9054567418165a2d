#!/usr/bin/env python3
"""Check a running three-node compose cluster: one namespace through every node's FUSE mount
and S3 door.

Run from the repository root once ``docker compose -f deploy/compose/docker-compose.cluster.yaml
up --build --wait`` has returned (any extra ``-f`` files of yours: ``--file`` again, in the
same order).  Needs only Python 3 and ``docker compose`` on the host: each step runs inside a
node's container (``docker compose exec``), the S3 steps with the image's own boto3 and the
root key of the compose file's ``TIERD_ROOT_*`` settings.  What it checks, in a bucket of
its own that it removes at the end:

1. every node answers ``/healthz``;
2. a bucket made through n1's S3 door is listed by n2 and n3;
3. a file written through n1's mount (not yet persisted: it is read from n1's hot tier
   through the peer door) reads byte-exact through n2's and n3's mounts and n3's S3 door;
4. an object PUT through n3's S3 door reads byte-exact through n1's mount;
5. a rename through n2's mount is seen by n3's mount and n1's S3 door (old name gone, new
   name there); a chmod through n3 is seen through n1; an unlink through n1 is gone on n2
   and n3;
6. with ``--kill``: a file written through n3's mount, then n3 killed (SIGKILL): n1's mount
   reads it byte-exact or fails with an I/O error (its bytes may be on n3 alone), never
   other bytes; n2 serves the bucket meanwhile; once n3 is started again and healthy, n1
   reads the file byte-exact;
7. with ``--restart-db``: PostgreSQL restarted (``docker compose restart postgres``) after a
   file was written through n1: a write through n2 succeeds again within 90 s, and both
   files read byte-exact through n3's mount.

Prints one line per step and exits 1 at the first that fails (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable

NODES = ("tierd-n1", "tierd-n2", "tierd-n3")
MNT = "/mnt/tierd"
#: runs inside a node: an S3 call to that node's own door, as the root key; prints JSON
S3_SNIPPET = r"""
import json, os, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:9000", region_name="us-east-1",
                  aws_access_key_id=os.environ["TIERD_ROOT_ACCESS_KEY"],
                  aws_secret_access_key=os.environ["TIERD_ROOT_SECRET_KEY"],
                  config=Config(retries={"max_attempts": 1}))
op, args = sys.argv[1], json.loads(sys.argv[2])
if op == "mb":
    s3.create_bucket(Bucket=args["bucket"]); out = None
elif op == "buckets":
    out = sorted(b["Name"] for b in s3.list_buckets()["Buckets"])
elif op == "put":
    s3.put_object(Bucket=args["bucket"], Key=args["key"], Body=bytes.fromhex(args["hex"]))
    out = None
elif op == "get":
    try:
        out = s3.get_object(Bucket=args["bucket"], Key=args["key"])["Body"].read().hex()
    except s3.exceptions.NoSuchKey:
        out = None
elif op == "rb":
    for o in s3.list_objects_v2(Bucket=args["bucket"]).get("Contents", []):
        s3.delete_object(Bucket=args["bucket"], Key=o["Key"])
    s3.delete_bucket(Bucket=args["bucket"]); out = None
print(json.dumps(out))
"""


class Check:
    def __init__(self, files: list[str]) -> None:
        self.compose = ["docker", "compose"] + [a for f in files for a in ("-f", f)]

    def exec(self, node: str, *argv: str, stdin: bytes | None = None) -> bytes:
        done = subprocess.run([*self.compose, "exec", "-T", node, *argv], input=stdin,
                              capture_output=True, timeout=120)
        if done.returncode != 0:
            raise Failed(f"{node}: {' '.join(argv[:3])}...: exit {done.returncode}: "
                         f"{done.stderr.decode(errors='replace').strip()[-400:]}")
        return done.stdout

    def compose_cmd(self, *argv: str) -> None:
        subprocess.run([*self.compose, *argv], check=True, capture_output=True, timeout=300)

    def sh(self, node: str, script: str, stdin: bytes | None = None) -> bytes:
        return self.exec(node, "sh", "-c", script, stdin=stdin)

    def s3(self, node: str, op: str, **args: str) -> object:
        out = self.exec(node, "python", "-c", S3_SNIPPET, op, json.dumps(args))
        return json.loads(out)


class Failed(Exception):
    pass


def expect(what: str, ok: bool, detail: str = "") -> None:
    if not ok:
        raise Failed(f"{what}{': ' + detail if detail else ''}")
    print(f"ok  {what}", flush=True)


def until(what: str, probe: Callable[[], bool], timeout: float = 5.0) -> None:
    """``probe()`` true within ``timeout`` s (a change seen by another node's kernel may wait
    for that node's change feed, docs/cluster.md "Consistency")."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        if probe():
            took = time.monotonic() - t0
            expect(what + (f" ({took:.1f} s)" if took >= 0.5 else ""), True)
            return
        if time.monotonic() > deadline:
            expect(what, False, f"not within {timeout:.0f} s")
        time.sleep(0.2)


def listed_as(c: Check, node: str, path: str, names: list[bytes]) -> bool:
    return c.sh(node, f"ls {path}").split() == names


def healthy(c: Check, node: str) -> bool:
    try:
        return c.exec(node, "python", "-c", "import urllib.request; print(urllib.request."
                      "urlopen('http://127.0.0.1:9001/healthz', timeout=4).read().decode())"
                      ).strip() == b"ok"
    except Failed:
        return False


def kill_and_return(c: Check, bucket: str) -> None:
    blob = secrets.token_bytes(1 << 20)
    path = f"{MNT}/{bucket}/from-n3.bin"
    c.sh("tierd-n3", f"cat > {path}", stdin=blob)
    c.compose_cmd("kill", "-s", "KILL", "tierd-n3")
    done = subprocess.run([*c.compose, "exec", "-T", "tierd-n1", "cat", path],
                          capture_output=True, timeout=120)
    exact = done.returncode == 0 and done.stdout == blob
    eio = done.returncode != 0 and b"Input/output error" in done.stderr
    expect("n3 killed: its file on n1 reads " + ("byte-exact" if exact else "EIO"),
           exact or eio,
           f"exit {done.returncode}, {len(done.stdout)} bytes, {done.stderr[-200:]!r}")
    expect("n3 killed: n2 still serves the bucket",
           b"from-n3.bin" in c.sh("tierd-n2", f"ls {MNT}/{bucket}"))
    c.compose_cmd("start", "tierd-n3")
    until("n3 started again is healthy", lambda: healthy(c, "tierd-n3"), 90)
    until("n3 back: its file reads byte-exact on n1", lambda: c.sh(
        "tierd-n1", f"cat {path} 2>/dev/null || true") == blob, 30)


def wrote(c: Check, node: str, path: str, data: bytes) -> bool:
    try:
        c.sh(node, f"cat > {path}", stdin=data)
        return True
    except Failed:
        return False


def restart_db(c: Check, bucket: str) -> None:
    before, after = secrets.token_bytes(100_000), secrets.token_bytes(100_000)
    c.sh("tierd-n1", f"cat > {MNT}/{bucket}/before-db.bin", stdin=before)
    c.compose_cmd("restart", "postgres")
    until("PostgreSQL restarted: a write through n2 succeeds again", functools.partial(
        wrote, c, "tierd-n2", f"{MNT}/{bucket}/after-db.bin", after), 90)
    expect("the files written before and after the restart read byte-exact on n3",
           c.sh("tierd-n3", f"cat {MNT}/{bucket}/before-db.bin") == before
           and c.sh("tierd-n3", f"cat {MNT}/{bucket}/after-db.bin") == after)


def run(c: Check, kill: bool, db: bool = False) -> None:
    for n in NODES:
        expect(f"{n} /healthz", healthy(c, n))
    bucket = "check-" + secrets.token_hex(4)
    c.s3("tierd-n1", "mb", bucket=bucket)
    try:
        for n in NODES[1:]:
            listed = c.s3(n, "buckets")
            expect(f"bucket made on n1 is listed by {n}",
                   isinstance(listed, list) and bucket in listed, str(listed))
        blob = secrets.token_bytes(3 << 20)
        path = f"{MNT}/{bucket}/from-n1.bin"
        c.sh("tierd-n1", f"cat > {path}", stdin=blob)
        for n in NODES[1:]:
            got = c.sh(n, f"cat {path}")
            expect(f"n1's mount -> {n}'s mount, 3 MiB byte-exact", got == blob,
                   f"{len(got)} bytes")
        got_hex = c.s3("tierd-n3", "get", bucket=bucket, key="from-n1.bin")
        expect("n1's mount -> n3's S3 door byte-exact", got_hex == blob.hex())
        small = secrets.token_bytes(1000)
        c.s3("tierd-n3", "put", bucket=bucket, key="dir/from-n3.bin", hex=small.hex())
        got = c.sh("tierd-n1", f"cat {MNT}/{bucket}/dir/from-n3.bin")
        expect("n3's S3 PUT -> n1's mount byte-exact", got == small)
        c.sh("tierd-n2", f"mv {path} {MNT}/{bucket}/renamed.bin")
        until("a rename on n2: the new name on n3's mount, the old one gone", lambda: c.sh(
            "tierd-n3", f"ls {MNT}/{bucket}").split() == [b"dir", b"renamed.bin"])
        expect("the rename on n2 -> n1's S3 door",
               c.s3("tierd-n1", "get", bucket=bucket, key="renamed.bin") == blob.hex()
               and c.s3("tierd-n1", "get", bucket=bucket, key="from-n1.bin") is None)
        c.sh("tierd-n3", f"chmod 600 {MNT}/{bucket}/renamed.bin")
        until("a chmod on n3 -> n1's mount", lambda: c.sh(
            "tierd-n1", f"stat -c %a {MNT}/{bucket}/renamed.bin").strip() == b"600")
        c.sh("tierd-n1", f"rm {MNT}/{bucket}/renamed.bin")
        for n in NODES[1:]:
            until(f"an unlink on n1 -> gone on {n}'s mount",
                  functools.partial(listed_as, c, n, f"{MNT}/{bucket}", [b"dir"]))
        if kill:
            kill_and_return(c, bucket)
        if db:
            restart_db(c, bucket)
    finally:
        c.s3("tierd-n1", "rb", bucket=bucket)
    print("ok  the bucket removed; all checks passed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", "-f", action="append", dest="files",
                    help="compose file (repeatable; default "
                    "deploy/compose/docker-compose.cluster.yaml)")
    ap.add_argument("--kill", action="store_true",
                    help="also kill n3 (SIGKILL) and start it again (step 6)")
    ap.add_argument("--restart-db", action="store_true",
                    help="also restart PostgreSQL mid-check (step 7)")
    args = ap.parse_args()
    try:
        run(Check(args.files or ["deploy/compose/docker-compose.cluster.yaml"]), args.kill,
            args.restart_db)
    except (Failed, subprocess.TimeoutExpired) as e:
        print(f"FAIL {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
