"""What a checkpoint is on disk, and the names it lives under.

``<bucket>/<run>/step-<N>/data`` holds every tensor's bytes back to back (aligned), and
``<bucket>/<run>/step-<N>/manifest.json`` says where each one is.  Both are ordinary files:
the mount and S3 read them like any other.  A step is written under
``<run>/.tierd-tmp-step-<N>`` and renamed into place in one metadata transaction, so a
reader sees the whole step directory or none of it; a temporary directory left by a crash
is removed the next time its run is touched.

The manifest is made by the client SDK (which knows tensors); the daemon checks only what
it relies on: entries lie inside the data, and names are names.
"""

from __future__ import annotations

import errno
import re
from typing import Any

from tierd.errors import FsError

FORMAT = "tierd-ckpt/1"
DATA = "data"
PART_PREFIX = "data-"
MANIFEST = "manifest.json"
#: most parts (ranks) one step may have
MAX_PARTS = 1 << 16
TMP_PREFIX = ".tierd-tmp-step-"
_RUN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,199}")
_SAVE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_STEP = re.compile(r"step-(0|[1-9][0-9]{0,17})")


def check_run(run: object) -> str:
    if not isinstance(run, str) or not _RUN.fullmatch(run):
        raise FsError(errno.EINVAL, f"run name {run!r} is not valid: use 1-200 letters, "
                      "digits and _ . = + - (not starting with . or -)")
    return run


def check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**18:
        raise FsError(errno.EINVAL, f"step must be a non-negative integer, not {step!r}")
    return step


def step_dir(step: int) -> str:
    return f"step-{step}"


def tmp_dir(step: int, save: str = "") -> str:
    """The step's temporary directory; a multi-part step's is its save attempt's own, so
    removing an abandoned attempt never touches the parts of the attempt that replaced it."""
    return f"{TMP_PREFIX}{step}-{save}" if save else f"{TMP_PREFIX}{step}"


def check_save(save: object) -> str:
    if not isinstance(save, str) or not _SAVE.fullmatch(save):
        raise FsError(errno.EINVAL, f"save id {save!r} is not valid: 1-64 letters, digits, "
                      "_ and -")
    return save


def part_name(part: int) -> str:
    """The file of one rank's part in a multi-part step directory."""
    return f"{PART_PREFIX}{part}"


def check_parts(part: object, parts: object) -> tuple[int, int]:
    if (isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= MAX_PARTS
            or isinstance(part, bool) or not isinstance(part, int)
            or not 0 <= part < parts):
        raise FsError(errno.EINVAL, f"part {part!r} of {parts!r} is not valid: parts is the "
                      f"job's world size (1-{MAX_PARTS}), part a rank below it")
    return part, parts


def check_global_manifest(doc: object, parts: int) -> dict[str, Any]:
    """The coordinator's manifest of a multi-part step: one ``parts`` entry (index and
    size) per rank, the rest (DCP's metadata) opaque."""
    if not isinstance(doc, dict):
        raise FsError(errno.EINVAL, "manifest must be a JSON object")
    listed = doc.get("parts")
    if not isinstance(listed, list) or len(listed) != parts:
        raise FsError(errno.EINVAL, f"manifest needs a 'parts' list of {parts} entries")
    for i, e in enumerate(listed):
        if (not isinstance(e, dict) or e.get("part") != i or not isinstance(e.get("size"), int)
                or e["size"] < 0):
            raise FsError(errno.EINVAL, f"manifest part entry {i} needs part={i} and a size")
    doc.setdefault("entries", [])
    doc["size"] = 0  # the data is in the parts' files
    return doc


def parse_step_dir(name: str) -> int | None:
    m = _STEP.fullmatch(name)
    return int(m.group(1)) if m else None


def check_manifest(doc: object, region_size: int) -> dict[str, Any]:
    """The client's manifest, refused unless every entry lies inside the region."""
    if not isinstance(doc, dict):
        raise FsError(errno.EINVAL, "manifest must be a JSON object")
    size = doc.get("size")
    if not isinstance(size, int) or not 0 <= size <= region_size:
        raise FsError(errno.EINVAL, f"manifest size {size!r} does not fit the region of "
                      f"{region_size} bytes")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise FsError(errno.EINVAL, "manifest needs an 'entries' list")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("key"), str):
            raise FsError(errno.EINVAL, f"manifest entry {i} needs a string 'key'")
        off, n = e.get("offset"), e.get("nbytes")
        if not (isinstance(off, int) and isinstance(n, int) and off >= 0 and n >= 0
                and off + n <= size):
            raise FsError(errno.EINVAL, f"manifest entry {e['key']!r} lies outside the "
                          f"{size} bytes of data")
    return doc
