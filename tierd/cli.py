"""The ``tierd`` command: ``tierd serve`` runs the daemon, ``tierd version`` prints the version.

``serve`` has one flag per setting, generated from the settings table in
:mod:`tierd.config`, so a new setting gets its flag (and its ``TIERD_*`` variable) for free.

Exit codes: 0 after a clean stop (SIGTERM/SIGINT), 1 when the daemon cannot start (lock held,
port in use, ...), 2 for a bad configuration or bad usage.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tierd import __version__
from tierd.config import SETTINGS, ConfigError, load_config

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


@cli.command()
@click.option(
    "--config",
    "config_file",
    default=None,
    metavar="FILE",
    help="TOML config file [env: TIERD_CONFIG].",
)
@_setting_options
def serve(config_file: str | None, **settings: str | None) -> None:
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
    log.info("starting", extra=kv(version=__version__, **config.as_dict()))
    try:
        asyncio.run(Daemon(config).run())
    except StartupError as e:
        # critical: shown whatever log_level says, since the process is about to exit
        log.critical("cannot start: %s", e)
        sys.exit(EXIT_STARTUP)


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
