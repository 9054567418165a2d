"""The ``tierd`` command: ``tierd serve`` runs the daemon, ``tierd version`` prints the version,
``tierd meta dump|load`` moves the metadata between engines (:mod:`tierd.meta.transfer`).

``serve`` has one flag per setting, generated from the settings table in
:mod:`tierd.config`, so a new setting gets its flag (and its ``TIERD_*`` variable) for free.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT), 1 when the daemon cannot start (lock held,
port in use, ...), 2 for a bad configuration or bad usage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tierd import __version__
from tierd.config import _META_KEY, SETTINGS, Config, ConfigError, load_config

EXIT_STARTUP = 1
EXIT_CONFIG = 2

F = TypeVar("F", bound=Callable[..., Any])


def _setting_options(f: F) -> F:
    """Add ``--<setting>`` for every setting (all default to None = "not given")."""
    for spec in reversed(SETTINGS):
        f = click.option(
            spec.flag,
            spec.name,
            default=None,
            metavar=spec.info.metavar,
            help=f"{spec.info.help} [env: {spec.env}]",
        )(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tierd")
def cli() -> None:
    """tierd: one namespace through FUSE, S3 and an admin API over tiered storage."""


def changed_settings(config: Config) -> dict[str, object]:
    """The settings of ``config`` that are not their defaults (a derived default, such as
    ``meta_dir``, as derived from this configuration), as :meth:`Config.as_dict` shows them
    (secrets redacted)."""
    shown = config.as_dict()
    out: dict[str, object] = {}
    for f in dataclasses.fields(Config):
        info = f.metadata[_META_KEY]
        if info.derive is not None:
            default = info.derive(config)
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = f.default
        if getattr(config, f.name) != default:
            out[f.name] = shown[f.name]
    return out


@cli.command()
@click.option(
    "--config",
    "config_file",
    default=None,
    metavar="FILE",
    help="TOML config file [env: TIERD_CONFIG].",
)
@click.option("--exit-on-unmount", is_flag=True, hidden=True,
              help="Stop when the mount is removed from outside (set by `tierd mount`).")
@_setting_options
def serve(config_file: str | None, exit_on_unmount: bool = False,
          **settings: str | None) -> None:
    """Run the daemon until SIGTERM or SIGINT.

    Settings come from defaults < the TOML file < TIERD_* variables < these flags.
    """
    try:
        config = load_config(cli=settings, config_file=config_file)
    except ConfigError as e:
        click.echo(f"tierd: configuration error: {e}", err=True)
        sys.exit(EXIT_CONFIG)

    # Imported here so `tierd version` and config errors stay fast and work even when an
    # optional door fails to import.
    from tierd.daemon import Daemon, StartupError
    from tierd.logs import get_logger, kv, setup_logging

    setup_logging(config.log_level, config.log_format)
    log = get_logger("daemon")
    changed = changed_settings(config)
    # one short line, then each setting that is not its default on its own line (debug):
    # a start-up failure right after stays readable (it used to follow every setting on
    # one line of 2,000 characters)
    log.info("starting", extra=kv(version=__version__, data_dir=str(config.data_dir),
                                  settings_changed=len(changed)))
    for name, value in changed.items():
        log.debug("setting", extra=kv(name=name, value=value))
    try:
        asyncio.run(Daemon(config, exit_on_unmount=exit_on_unmount).run())
    except StartupError as e:
        # critical: shown whatever log_level says, since the process is about to exit
        log.critical("cannot start: %s", e)
        sys.exit(EXIT_STARTUP)


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--foreground", "-f", is_flag=True,
              help="Serve in this process (like `tierd serve --mount`) instead of detaching.")
@click.option("--timeout", default=30.0, show_default=True, metavar="SECONDS",
              help="How long to wait for the mount to appear.")
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
def mount(mountpoint: str, foreground: bool, timeout: float, serve_args: tuple[str, ...]) -> None:
    """Mount the namespace at MOUNTPOINT: start a daemon serving it and return once mounted.

    Extra options are passed to `tierd serve` (e.g. --data-dir DIR --s3-listen HOST:PORT).
    The detached daemon logs to DATA_DIR/tierd.log and stops when the mount is removed with
    `tierd umount`.
    """
    from tierd_fuse.cli import mount_detached, serve_foreground

    if foreground:
        sys.exit(serve_foreground(mountpoint, serve_args))
    sys.exit(mount_detached(mountpoint, serve_args, timeout))


@cli.command()
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--lazy", "-l", is_flag=True,
              help="Detach now even if files are open (they are closed as processes exit).")
def umount(mountpoint: str, lazy: bool) -> None:
    """Unmount a tierd mount; its daemon (started by `tierd mount`) then stops.

    A stale mount left by a killed daemon is cleared.
    """
    from tierd_fuse.cli import umount_cli

    sys.exit(umount_cli(mountpoint, lazy))


@cli.group()
def meta() -> None:
    """Move the metadata between engines (lmdb <-> PostgreSQL) while the daemon is stopped.

    The engine is the one the settings name: meta_url, else lmdb in meta_dir.

    \b
    Growing a single node into a cluster (docs/cluster.md):
      tierd meta dump ns.dump --data-dir DIR          (the single node, stopped)
      TIERD_CLUSTER_SECRET=... tierd meta load ns.dump --node n1 --data-dir DIR
                      --meta-url postgresql://...     (into the cluster's empty database)
    (the secret from the environment: a command line is readable by every local user)
    then start node n1 on DIR; its files not yet in cold stay on it, served to the other
    nodes and persisted by it.  Back to one node: dump the cluster's database and load it
    with --node NAME into an lmdb store (NAME's data directory).
    """


def _transfer_config(config_file: str | None, settings: dict[str, str | None]) -> Config:
    """The settings of a dump or load.  ``cluster_secret`` is also taken beside a single
    node's settings (a daemon would refuse it without ``node_name``): a load re-seals the
    S3 secrets between that node's key and the cluster's."""
    try:
        return load_config(cli=settings, config_file=config_file)
    except ConfigError:
        secret = settings.get("cluster_secret") or os.environ.get("TIERD_CLUSTER_SECRET")
        if not secret:
            raise
        env = {k: v for k, v in os.environ.items() if k != "TIERD_CLUSTER_SECRET"}
        try:
            config = load_config(cli={**settings, "cluster_secret": None}, env=env,
                                 config_file=config_file)
        except ConfigError:
            pass
        else:
            return dataclasses.replace(config, cluster_secret=secret)
        raise


def _run_transfer(config_file: str | None, settings: dict[str, str | None],
                  action: Callable[[Any, Config], int]) -> int:
    """Load the settings, take the data directory's lock, open the raw engine, run
    ``action`` on it; exit 2 for bad settings, 1 for anything else that fails."""
    from tierd.daemon import DataDirLock
    from tierd.meta.transfer import open_engine

    try:
        config = _transfer_config(config_file, settings)
    except ConfigError as e:
        click.echo(f"tierd: configuration error: {e}", err=True)
        sys.exit(EXIT_CONFIG)
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        lock = DataDirLock(config.lock_file)
        lock.acquire()
        try:
            engine = open_engine(config.meta_url, config.meta_dir, config.meta_map_size)
            try:
                return action(engine, config)
            finally:
                engine.close()
        finally:
            lock.release()
    except Exception as e:  # StartupError (the lock), DumpError, lmdb's, psycopg's
        click.echo(f"tierd: {type(e).__name__}: {e}", err=True)
        sys.exit(EXIT_STARTUP)


_config_option = click.option("--config", "config_file", default=None, metavar="FILE",
                              help="TOML config file [env: TIERD_CONFIG].")


@meta.command("dump")
@click.argument("file", type=click.Path(dir_okay=False))
@_config_option
@_setting_options
def meta_dump(file: str, config_file: str | None, **settings: str | None) -> None:
    """Write every metadata key to FILE (one snapshot, streamed)."""
    from pathlib import Path

    from tierd.meta.transfer import dump_file

    n = _run_transfer(config_file, settings,
                      lambda engine, _config: dump_file(engine, Path(file)))
    click.echo(f"dumped {n} keys to {file}")


def _resealer(config: Config, into_cluster: bool) -> Callable[[str, bytes], bytes]:
    """Re-seals S3 secrets between this data directory's secrets.key (a single node) and
    the key derived from cluster_secret (every node of a cluster): a key sealed with one
    opens only with it.  The boxes are made at the first sealed secret."""
    from tierd.acl.secrets import KEY_FILE, SecretBox, SecretError
    from tierd.meta.transfer import DumpError

    boxes: list[SecretBox] = []

    def reseal(access_key: str, sealed: bytes) -> bytes:
        if not boxes:
            if not config.cluster_secret:
                raise DumpError("the namespace holds S3 access keys whose secrets must be "
                                "sealed again with the cluster's key: set cluster_secret "
                                "(TIERD_CLUSTER_SECRET), the same as the nodes'")
            key_file = config.data_dir / KEY_FILE
            if into_cluster and not key_file.exists():
                raise DumpError(f"{key_file} is missing: give the single node's data "
                                "directory (--data-dir), whose key sealed its S3 secrets")
            local = SecretBox.from_data_dir(config.data_dir)
            shared = SecretBox.from_cluster_secret(config.cluster_secret)
            boxes.extend([local, shared] if into_cluster else [shared, local])
        try:
            return boxes[1].seal(boxes[0].open(sealed, access_key), access_key)
        except SecretError as e:
            raise DumpError(f"access key {access_key}: {e}") from None

    return reseal


@meta.command("load")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--node", default="", metavar="NAME",
              help="Into a cluster's database (meta_url): adopt a single node's namespace as "
                   "node NAME, the node that will serve this data directory (its files not "
                   "yet in cold, open or being written stay its own).  Into lmdb: make a "
                   "cluster's namespace node NAME's alone (refused while another node holds "
                   "bytes not yet in cold).")
@_config_option
@_setting_options
def meta_load(file: str, node: str, config_file: str | None, **settings: str | None) -> None:
    """Load FILE (from `tierd meta dump`) into the empty store, in one transaction.

    Refused, with nothing written: a store that is not empty, a damaged or cut file, a
    --node adoption of a dump that is a cluster's already, or the reverse of one that is
    a single node's.
    """
    from tierd.config import parse_node_name
    from tierd.meta.transfer import load

    try:
        parse_node_name(node, None)  # type: ignore[arg-type]  # the context is unused
    except ValueError as e:
        click.echo(f"tierd: --node: {e}", err=True)
        sys.exit(EXIT_CONFIG)

    def action(engine: Any, config: Config) -> int:
        if node and config.node_name and config.node_name != node:
            raise ValueError(f"--node {node} but node_name is {config.node_name}: adopt the "
                             "namespace as the node that will serve this data directory")
        into_cluster = bool(config.meta_url)
        with open(file, "rb") as f:
            return load(engine, f, node=node, cluster=into_cluster,
                        reseal=_resealer(config, into_cluster) if node else None)

    n = _run_transfer(config_file, settings, action)
    click.echo(f"loaded {n} keys from {file}" + (f" as node {node}" if node else ""))


@cli.command()
def version() -> None:
    """Print the tierd version."""
    click.echo(f"tierd {__version__}")


def main() -> None:
    """Console-script entry point (``tierd``)."""
    try:
        cli(prog_name="tierd")
    except KeyboardInterrupt:  # Ctrl-C before the daemon installed its handlers
        sys.exit(130)


if __name__ == "__main__":
    main()
