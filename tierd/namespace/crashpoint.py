"""Named crash points: kill the daemon (SIGKILL, nothing flushed) at an exact step.

A crash-consistency claim ("a kill at any instant leaves the old or the new state") is only
tested if the kill lands between the steps that matter: after a commit and before the flush
that makes it durable, after the flush and before the space is reclaimed, and so on.  Random
timing rarely hits a window of a few milliseconds; a named point always does.  The tests of
``tests/durability`` start the daemon with

    TIERD_CRASHPOINT=name[:n][@armfile]

and the ``n``-th time (default: the first) the code passes ``crashpoint("name")`` the process
kills itself with SIGKILL.  With ``@armfile`` a pass counts only while that file exists, so
a test can set up files through the same code paths first and then arm the point.  Unset
(every production run) a crash point is one string comparison.
"""

from __future__ import annotations

import os
import signal

_spec = os.environ.get("TIERD_CRASHPOINT", "")
_target, _, _arm = _spec.partition("@")
_name, _, _count = _target.partition(":")
_left = int(_count) if _count else 1


def crashpoint(name: str) -> None:
    """Die here if ``TIERD_CRASHPOINT`` names this point (see the module doc)."""
    global _left
    if name != _name:
        return
    if _arm and not os.path.exists(_arm):
        return
    _left -= 1
    if _left <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
