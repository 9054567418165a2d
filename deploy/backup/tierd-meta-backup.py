#!/usr/bin/env python3
"""Copy tierd's metadata store (lmdb) consistently, while tierd runs or not.

    tierd-meta-backup.py DATA_DIR DEST [--meta-dir META_DIR]

DEST (a new or empty directory) receives ``meta/data.mdb``: a compacted copy of the lmdb
environment made inside one read transaction (``mdb_env_copy2`` with MDB_CP_COMPACT, what
``mdb_copy -c`` does), so it is one consistent state of the store even while tierd commits;
and ``secrets.key``, without which the S3 secrets in the copy cannot be decrypted.  Run it
with tierd's Python (it needs the ``lmdb`` module): /usr/local/bin/python3, or the venv's.
See docs/operations.md, "Backing up the metadata".
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import lmdb


def backup(meta_dir: Path, secrets_key: Path, dest: Path) -> None:
    if not (meta_dir / "data.mdb").is_file():
        raise SystemExit(f"tierd-meta-backup: {meta_dir} holds no lmdb store (data.mdb)")
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"tierd-meta-backup: {dest} is not empty")
    (dest / "meta").mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(dest, 0o700)
    # readonly: never a write transaction, so it cannot wait for (or block) tierd's writer;
    # the reader slot it takes in lock.mdb is released at close
    env = lmdb.open(str(meta_dir), readonly=True, lock=True, subdir=True, max_dbs=0)
    try:
        env.copy(str(dest / "meta"), compact=True)
    finally:
        env.close()
    if secrets_key.is_file():
        shutil.copy2(secrets_key, dest / "secrets.key")
        os.chmod(dest / "secrets.key", 0o600)
    else:
        print(f"tierd-meta-backup: warning: no {secrets_key}: S3 keys other than the root "
              "key will not be usable from this copy", file=sys.stderr)
    print(f"tierd-meta-backup: {meta_dir} -> {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir", type=Path, help="tierd's data_dir")
    ap.add_argument("dest", type=Path, help="new or empty directory for the copy")
    ap.add_argument("--meta-dir", type=Path, help="tierd's meta_dir (default DATA_DIR/meta)")
    args = ap.parse_args()
    backup(args.meta_dir or args.data_dir / "meta", args.data_dir / "secrets.key", args.dest)


if __name__ == "__main__":
    main()
