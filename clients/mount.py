"""Where tierd's FUSE mount is, for code that writes files through it (``torch.save`` of a
checkpoint, a dataset copied in) -- and never a plain directory of the same name.

A script that writes to ``/mnt/tierd/...`` while no tierd mount is there writes to the
node's local disk: the files look saved, yet they are on no tier, never reach the cold store
and are lost with the node.  :func:`tierd_mount` finds the mount and checks that it is one:

* the directory is ``path`` when given, else ``TIERD_MOUNT``, else the ``mount`` in the
  running daemon's ``endpoints.json`` (in ``TIERD_DATA_DIR`` or the default data
  directory), else ``/mnt/tierd``;
* it (or the mount it lies in) must be a mount of file system type ``fuse.tierd`` in
  ``/proc/self/mountinfo``; otherwise :class:`MountNotFound` (a ``FileNotFoundError``) says
  what is there instead and how to mount tierd.  Nothing is created on the way.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

#: where operators mount tierd when nothing says otherwise (docs/operations.md)
DEFAULT_MOUNT = Path("/mnt/tierd")
#: the file system type of tierd's FUSE mount (``subtype=tierd``)
FSTYPE = "fuse.tierd"
MOUNTINFO = Path("/proc/self/mountinfo")


class MountNotFound(FileNotFoundError):
    """The directory meant to be tierd's mount is not one (missing, a plain directory, or
    another file system): writing there would write to local disk."""


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount this process sees, in mount order."""
    out = []
    for line in MOUNTINFO.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) >= 5 and rfields:
            out.append((_unescape(fields[4]), rfields[0]))
    return out


def _from_daemon() -> Path | None:
    """The mount of the running daemon, from its ``endpoints.json``."""
    data = os.environ.get("TIERD_DATA_DIR")
    if not data:
        import platformdirs

        data = platformdirs.user_data_dir("tierd")
    try:
        mount = json.loads((Path(data) / "endpoints.json").read_text()).get("mount")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(mount) if isinstance(mount, str) and mount else None


def _candidate(path: str | os.PathLike[str] | None) -> tuple[Path, str]:
    """The directory to check, and where that choice came from (for the error)."""
    if path is not None:
        return Path(path), "the path given"
    env = os.environ.get("TIERD_MOUNT")
    if env:
        return Path(env), "TIERD_MOUNT"
    found = _from_daemon()
    if found is not None:
        return found, "the daemon's endpoints.json"
    return DEFAULT_MOUNT, "the default (TIERD_MOUNT is not set, and no running daemon "\
        "names a mount)"


def tierd_mount(path: str | os.PathLike[str] | None = None) -> Path:
    """The tierd mount (or the directory inside one) to write to; :class:`MountNotFound`
    when it is not inside a tierd mount (see the module docstring)."""
    where, source = _candidate(path)
    real = os.path.realpath(where)
    best, fstype = "", ""
    for point, kind in mounts():  # the deepest mount holding ``real``; the last if stacked
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, kind
    if fstype == FSTYPE:
        if not os.path.isdir(real):
            raise MountNotFound(f"{where} (from {source}) is inside the tierd mount at "
                                f"{best} but is not a directory there")
        return Path(where)
    if not os.path.exists(real):
        what = "it does not exist"
    elif best and best == real:
        what = f"it is a {fstype} mount, not tierd's"
    else:
        what = f"it is a plain directory on the {fstype or 'unknown'} file system at {best}"
    raise MountNotFound(
        f"{where} (from {source}) is not a tierd mount: {what}. Files written there would "
        "stay on this machine's local disk. Mount tierd there (tierd serve --mount DIR, "
        "or tierd mount DIR), or set TIERD_MOUNT to the directory where it is mounted.")
