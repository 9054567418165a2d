"""How the admin API is put together: every endpoint is a module-level handler (on its
module's ``RouteTableDef``), never a closure over the daemon, and the door reaches the daemon
only through what :class:`tierd.admin.backend.AdminBackend` declares (mypy checks that the
daemon provides it), never by probing it with ``getattr``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from tierd.admin import AdminAuth, make_admin_app
from tierd.admin.metrics import instrument_admin
from tierd.config import Config
from tierd.daemon import Daemon

ADMIN = Path(__file__).resolve().parents[2] / "tierd" / "admin"


def test_every_route_is_a_module_level_handler(tmp_path: Path) -> None:
    d = Daemon(Config(data_dir=tmp_path / "data"))
    app = make_admin_app(d, AdminAuth("t" * 32, None))
    instrument_admin(app, d.metrics)
    handlers = [r.handler for r in app.router.routes()]
    assert len(handlers) >= 40
    for h in handlers:
        h = inspect.unwrap(h)
        assert "<locals>" not in h.__qualname__, f"{h.__qualname__} is a closure"
        module = inspect.getmodule(h)
        assert module is not None and getattr(module, h.__name__, None) is not None, \
            f"{h.__qualname__} is not a name of its module"


def test_the_admin_door_does_not_probe_the_daemon() -> None:
    for path in sorted(ADMIN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "getattr" and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "backend":
                raise AssertionError(f"{path.name}:{node.lineno}: getattr on the backend "
                                     "(declare it in tierd/admin/backend.py instead)")
