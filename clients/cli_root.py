"""The ``tierctl`` click group and its global options.

It lives apart from :mod:`tierd_client.tierctl` so that the command modules
(``cli_status``, ``cli_placement``, ``cli_pool``, ``cli_users``, ``cli_jobs``) can import it
and register their commands, and ``tierctl`` imports them: no module imports the one that
imports it, and ``python -m tierd_client.tierctl`` (which runs tierctl as ``__main__``)
still finds one group.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .cli_common import DEFAULT_ADMIN_URL, ENDPOINTS_FILE, TOKEN_FILE, find_admin

F = TypeVar("F", bound=Callable[..., Any])
JSON_HELP = "Print the raw JSON document of the admin API (for scripts)."


def _origin(ctx: click.Context, name: str, flag: str, env: str) -> str:
    source = ctx.get_parameter_source(name)
    return env if source is click.core.ParameterSource.ENVIRONMENT else flag


def client_version() -> str:
    """The installed tierd distribution's version (tierctl ships with it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tierd")
    except PackageNotFoundError:
        return "unknown (not installed)"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(client_version(), "--version", "-V", prog_name="tierctl",
                      message="%(prog)s %(version)s")
@click.option(
    "--admin-url",
    envvar="TIERD_ADMIN_URL",
    default=None,
    help="Base URL of tierd's admin API [env: TIERD_ADMIN_URL; default: from the data "
    f"directory's {ENDPOINTS_FILE}, else {DEFAULT_ADMIN_URL}].",
)
@click.option("--token", envvar="TIERD_ADMIN_TOKEN", default=None,
              help=f"Admin API token [env: TIERD_ADMIN_TOKEN; default: DATA_DIR/{TOKEN_FILE}].")
@click.option("--data-dir", envvar="TIERD_DATA_DIR", default=None,
              type=click.Path(file_okay=False, path_type=Path),
              help="The daemon's data directory, where its admin token and endpoints are "
              "found [env: TIERD_DATA_DIR; default: the daemon's default].")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for tierd.")
@click.pass_context
def cli(ctx: click.Context, admin_url: str | None, token: str | None,
        data_dir: Path | None, timeout: float) -> None:
    """Administer a running tierd through its admin API.

    Tables for people; --json on a command prints the API's document for scripts.  Errors
    are one line on stderr: exit 1 (tierd unreachable, refused, failed), 2 (bad usage).
    """
    ctx.obj = find_admin(admin_url, token, data_dir, timeout,
                         url_origin=_origin(ctx, "admin_url", "--admin-url",
                                            "TIERD_ADMIN_URL"),
                         token_origin=_origin(ctx, "token", "--token", "TIERD_ADMIN_TOKEN"))


def json_option(fn: F) -> F:
    """The ``--json`` flag every command that prints something has."""
    return click.option("--json", "as_json", is_flag=True, help=JSON_HELP)(fn)
