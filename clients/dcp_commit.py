"""Passing a multi-node step's commit to the daemons that did not get it.

The coordinator commits a step on its own node's daemon.  Ranks on other nodes wrote parts
into their nodes' daemons, which must publish them too -- or drop them if the save failed.
Those ranks learn the outcome from the job's own key-value store (the one ``torchrun``
gives every process group), with the store as the decision record:

* the coordinator puts the global manifest under ``.../manifest``, then claims
  ``.../decision`` = ``commit`` (``compare_set``: only if nobody decided first), commits on
  its daemon and sets ``.../done`` to ``ok`` (or ``failed``);
* a rank on another node, after committing its part, waits in a thread for ``.../done``:
  ``ok`` → it passes the commit (with the manifest) to its daemon; ``failed`` → it aborts
  its part.  If ``done`` does not come within ``timeout`` it tries to claim ``decision`` =
  ``aborted``: if that wins, the coordinator will not commit and the rank aborts; if the
  coordinator had decided ``commit``, the rank keeps waiting.

A rank killed while waiting leaves its daemon's parts in doubt (the daemon settles them
from the cold store: :mod:`tierd.checkpoint.parts`).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from tierd_client.checkpoint import Checkpointer

log = logging.getLogger("tierd_client.dcp")

#: seconds a rank waits for the coordinator's outcome before it tries to abort the save
OUTCOME_TIMEOUT = 1800.0
#: seconds a process that ends waits for the outcomes it is still passing on
EXIT_WAIT = 60.0

_followers: set[threading.Thread] = set()


@atexit.register
def _drain() -> None:
    """A rank that returns from its last save and exits at once must still pass that
    save's commit on (or its daemon's parts stay in doubt)."""
    deadline = time.monotonic() + EXIT_WAIT
    for t in list(_followers):
        t.join(max(0.0, deadline - time.monotonic()))


def _store() -> Any:
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def _keys(save: str) -> tuple[str, str, str]:
    base = f"tierd-ckpt/{save}/"
    return base + "manifest", base + "decision", base + "done"


def coordinator_commit(ck: Checkpointer, run: str, step: int, parts: int, save: str,
                       manifest: dict[str, Any], remote: bool) -> None:
    """Commit the step on the coordinator's daemon; with ``remote`` parts (other nodes),
    through the store's decision (see the module docstring)."""
    if not remote:
        ck.commit(run, step, manifest, parts=parts, save=save)
        return
    store = _store()
    k_manifest, k_decision, k_done = _keys(save)
    store.set(k_manifest, json.dumps(manifest))
    decided = store.compare_set(k_decision, "", "commit")
    if bytes(decided) != b"commit":
        raise RuntimeError(f"step {step} of run {run!r}: another node gave up waiting for the "
                           "commit and aborted the save")
    try:
        ck.commit(run, step, manifest, parts=parts, save=save)
    except BaseException:
        store.set(k_done, "failed")
        raise
    store.set(k_done, "ok")


def follow(ck: Checkpointer, run: str, step: int, part: int, parts: int, save: str,
           timeout: float = OUTCOME_TIMEOUT) -> threading.Thread:
    """On a rank whose node is not the coordinator's: pass the outcome on, in a thread."""
    t = threading.Thread(target=_follow, args=(ck, run, step, part, parts, save, timeout),
                         name=f"tierd-ckpt-outcome-{step}", daemon=True)
    _followers.add(t)
    t.start()
    return t


def _follow(ck: Checkpointer, run: str, step: int, part: int, parts: int, save: str,
            timeout: float) -> None:
    k_manifest, k_decision, k_done = _keys(save)
    try:
        store = _store()
        deadline = time.monotonic() + timeout
        while True:
            try:
                store.wait([k_done], timedelta(seconds=max(1.0, min(
                    30.0, deadline - time.monotonic()))))
                break
            except (RuntimeError, dist.DistError):  # timed out: try again, or decide
                if time.monotonic() < deadline:
                    continue
                if bytes(store.compare_set(k_decision, "", "aborted")) == b"aborted":
                    ck.abort(run, step, part=part, parts=parts, save=save)
                    return
                deadline = time.monotonic() + timeout  # committed: its "done" is coming
        if bytes(store.get(k_done)) == b"ok":
            manifest = json.loads(bytes(store.get(k_manifest)))
            ck.commit(run, step, manifest, parts=parts, save=save)
        else:
            ck.abort(run, step, part=part, parts=parts, save=save)
    except Exception:  # the job's store went away: the daemon settles the parts itself
        log.warning("could not pass on the outcome of step %d of run %r", step, run,
                    exc_info=True)
    finally:
        _followers.discard(threading.current_thread())
