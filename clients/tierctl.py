"""``tierctl``: the operator's command line for a running tierd, over the admin API.

Status and health, placement (warmup/evict/pin/policy/du/ls/persist/import), jobs, the memory
pool and checkpoints, buckets and their policies, the FUSE mount, users and access keys,
shell completion.  The commands live in the
``cli_*`` modules, which register them on the group of :mod:`tierd_client.cli_root`; this
module imports them and is the entry point (``tierctl`` and
``python -m tierd_client.tierctl``).

Finding the daemon: ``--admin-url``/``TIERD_ADMIN_URL``, else the admin URL in the daemon's
``endpoints.json`` (in ``--data-dir``/``TIERD_DATA_DIR``, by default the daemon's own default
data directory), else ``http://127.0.0.1:9001``.  The admin token: ``--token``/
``TIERD_ADMIN_TOKEN``, else the ``admin-token`` file in that data directory (readable by the
daemon's user only).

Output: tables for people, ``--json`` for scripts (the API's documents as they are).  Every
error is one line on stderr, ``tierctl: ...``, never a traceback (``TIERCTL_DEBUG=1`` shows
one for a bug in tierctl itself).  Exit codes: 0 success, 1 tierd unreachable, refusing or
failing, 2 bad usage, 130 interrupted (a job being waited for is cancelled).
"""

from __future__ import annotations

import errno
import os
import sys

import click

from . import cli_buckets, cli_jobs, cli_placement, cli_pool, cli_status, cli_users
from .cli_common import AdminError, fail, getenv_debug
from .cli_root import cli

__all__ = ["cli", "cli_buckets", "cli_jobs", "cli_placement", "cli_pool", "cli_status",
           "cli_users", "main"]


def _usage_line(e: click.UsageError) -> str:
    """``user add: Missing option '--uid'. (see 'tierctl user add --help')``."""
    if e.ctx is None:
        return e.format_message()
    path = e.ctx.command_path
    where = path.partition(" ")[2]
    return (f"{where}: " if where else "") + f"{e.format_message()} (see '{path} --help')"


def main(args: list[str] | None = None) -> None:
    """Console-script entry point (``tierctl``): runs the group and turns every error into
    one line on stderr and an exit code."""
    try:
        code = cli.main(args, prog_name="tierctl", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:  # bare `tierctl`: the help, exit 2
        click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message(), err=True)
        sys.exit(2)
    except click.UsageError as e:
        fail(_usage_line(e), e.exit_code)
    except click.ClickException as e:
        fail(e.format_message(), e.exit_code)
    except click.Abort:
        fail("interrupted", 130)
    except AdminError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BrokenPipeError:  # `tierctl key list | head`: quiet, like other tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    except OSError as e:
        if e.errno == errno.EPIPE:
            sys.exit(1)
        if getenv_debug():
            raise
        fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
    except Exception as e:
        if getenv_debug():
            raise
        fail(f"internal error: {type(e).__name__}: {e} (a tierctl bug, or an answer it does "
             "not understand; TIERCTL_DEBUG=1 shows the traceback)")
    if isinstance(code, int) and code:  # ctx.exit(code) of a command
        sys.exit(code)


if __name__ == "__main__":
    main()
