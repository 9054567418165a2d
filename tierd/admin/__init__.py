"""The admin door: a JSON HTTP API for operators and ``tierctl``.

Every endpoint but ``/healthz`` requires the admin token or an admin user's SigV4
signature (:mod:`tierd.admin.auth`).
"""

from tierd.admin.app import make_admin_app
from tierd.admin.auth import AdminAuth, bootstrap_admin_token
from tierd.admin.backend import AdminBackend

__all__ = ["AdminAuth", "AdminBackend", "bootstrap_admin_token", "make_admin_app"]
