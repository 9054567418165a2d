"""``tierd mount`` and ``tierd umount``: the mount helpers of the command line.

``tierd mount DIR [serve options]`` checks the configuration, starts ``tierd serve --mount
DIR`` detached (its own session, log in ``DATA_DIR/tierd.log``) and returns once the mount
answers -- the way ``mount.fuse``/``s3fs`` behave.  That daemon stops when its mount is
removed, so ``tierd umount DIR`` is all it takes to stop it.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click

from .mount import FSNAME, MountError, find_mount, unmount

FSTYPE = f"fuse.{FSNAME}"


def _serve_cmd(mountpoint: str, serve_args: tuple[str, ...], detached: bool) -> list[str]:
    """The daemon's command line.  ``-P``: ``python -m`` would put the caller's directory
    first on ``sys.path``, and a ``./tierd`` there (a checkout, a data folder) would be
    imported instead of the installed package."""
    cmd = [sys.executable, "-P", "-m", "tierd.cli", "serve", "--mount",
           os.path.abspath(mountpoint)]
    if detached:
        cmd.append("--exit-on-unmount")
    return cmd + list(serve_args)


def _data_dir(serve_args: tuple[str, ...]) -> Path:
    """The data directory the daemon will use, from the same settings `serve` parses (bad
    settings fail here, before anything is started)."""
    from tierd.cli import serve
    from tierd.config import ConfigError, load_config

    ctx = serve.make_context("serve", list(serve_args))
    params = dict(ctx.params)
    config_file = params.pop("config_file", None)
    params.pop("exit_on_unmount", None)
    params.pop("mount", None)
    try:
        config = load_config(cli=params, config_file=config_file)
    except ConfigError as e:
        raise click.ClickException(f"configuration error: {e}") from None
    return config.data_dir


def serve_foreground(mountpoint: str, serve_args: tuple[str, ...]) -> int:
    os.execv(sys.executable, _serve_cmd(mountpoint, serve_args, detached=False))
    return 1  # not reached


def mount_detached(mountpoint: str, serve_args: tuple[str, ...], timeout: float) -> int:
    target = os.path.abspath(mountpoint)
    data_dir = _data_dir(serve_args)
    busy = find_mount(target)
    if busy is not None:
        click.echo(f"tierd: {target} is busy: {busy.fstype} from {busy.source} is mounted "
                   f"there (tierd umount {target} first)", err=True)
        return 1
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "tierd.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(_serve_cmd(target, serve_args, detached=True),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-5:]
            click.echo(f"tierd: the daemon exited with {code}:\n" + "\n".join(tail), err=True)
            return 1
        if _serving(data_dir, proc.pid):
            click.echo(f"tierd: mounted {target} (daemon pid {proc.pid}, log {log_path})")
            return 0
        time.sleep(0.05)
    proc.terminate()
    click.echo(f"tierd: {target} was not mounted within {timeout:.0f} s; see {log_path}",
               err=True)
    return 1


def _serving(data_dir: Path, pid: int) -> bool:
    """The daemon ``pid`` has mounted and is listening (its endpoints file says so)."""
    try:
        doc = json.loads((data_dir / "endpoints.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(doc.get("pid") == pid and doc.get("mount"))


def umount_cli(mountpoint: str, lazy: bool) -> int:
    target = os.path.abspath(mountpoint)
    info = find_mount(target)
    if info is None:
        click.echo(f"tierd: {target} is not mounted", err=True)
        return 1
    if info.fstype != FSTYPE:
        click.echo(f"tierd: {target} is a {info.fstype} mount, not tierd's", err=True)
        return 1
    try:
        os.statvfs(target)  # (a stat may come from the kernel's cache of a dead mount)
    except OSError as e:
        if e.errno != errno.ENOTCONN:
            raise
        lazy = True  # stale: nothing serves it any more
        click.echo(f"tierd: clearing stale mount {target}")
    try:
        unmount(target, lazy=lazy)
    except MountError as e:
        hint = "" if lazy else " (files open or a shell inside? close them, or use --lazy)"
        click.echo(f"tierd: {e}{hint}", err=True)
        return 1
    click.echo(f"tierd: unmounted {target}")
    return 0
