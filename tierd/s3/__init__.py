"""The S3 door: an aiohttp application translating S3 requests into namespace calls.

Modules: :mod:`~tierd.s3.app` (addressing, dispatch, errors), :mod:`~tierd.s3.operations`
(every operation declared once: recognition, IAM action, handler), :mod:`~tierd.s3.auth`
(SigV4), :mod:`~tierd.s3.body` (aws-chunked decoding, payload verification),
:mod:`~tierd.s3.checksums`, :mod:`~tierd.s3.errors`, :mod:`~tierd.s3.xmlio` and the
handlers :mod:`~tierd.s3.buckets`, :mod:`~tierd.s3.objects`, :mod:`~tierd.s3.listing`,
:mod:`~tierd.s3.multipart`.  Reference: ``docs/s3.md``.
"""

from tierd.s3.app import make_s3_app

__all__ = ["make_s3_app"]
