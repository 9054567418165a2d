"""The S3 door.  For now a placeholder (see :mod:`tierd.s3.app`); the gateway is issue #3."""

from tierd.s3.app import make_s3_app

__all__ = ["make_s3_app"]
