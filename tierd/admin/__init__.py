"""The admin door: a JSON HTTP API for operators and ``tierctl``.

No authentication yet: the listener defaults to 127.0.0.1.  An admin auth token
(``TIERD_ADMIN_TOKEN``) arrives in a later issue; until then do not expose ``admin_listen``
beyond the local host.
"""

from tierd.admin.app import AdminBackend, make_admin_app

__all__ = ["AdminBackend", "make_admin_app"]
