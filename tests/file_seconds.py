"""The seconds each test file took in a whole-suite run, kept in ``file_seconds.json`` beside
this module, so the suite can hand its two workers the slowest files first.

pytest-xdist (``--dist loadfile``) gives a worker one file at a time, in the order the files
come in; its default order (most tests first) puts the one-test files last, and those are the
long differential and install tests, so one worker ran alone for minutes at the end.  Sorted
longest first (``tests/conftest.py``), the last files are short and both workers finish
together.  A file missing from the table counts as :data:`DEFAULT_S`; stale figures only make
the order a little worse, never a test wrong.

Refresh after a whole-suite run that logged each test's time (``tests/conftest.py`` appends
one line a phase to the file ``TIERD_TEST_SECONDS`` names)::

    TIERD_TEST_SECONDS=/tmp/seconds.log ./dev.sh test
    .venv/bin/python tests/file_seconds.py /tmp/seconds.log
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
#: what a file the table does not name is taken to cost
DEFAULT_S = 5.0


def load() -> dict[str, float]:
    """File path (relative to the repository, as pytest names it) -> seconds."""
    try:
        table: dict[str, float] = json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return {}
    return table


def from_log(log: Path) -> dict[str, float]:
    """Sum each file's phase times (set-up and tear-down included) from a run's log."""
    seconds: dict[str, float] = defaultdict(float)
    for line in log.read_text().splitlines():
        duration, _, nodeid = line.partition(" ")
        seconds[nodeid.partition("::")[0]] += float(duration)
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tests/file_seconds.py SECONDS_LOG", file=sys.stderr)
        return 2
    table = from_log(Path(argv[0]))
    TABLE.write_text(json.dumps(table, indent=0) + "\n")
    print(f"{len(table)} files, {sum(table.values()):.0f} s in all -> {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
