"""The multipart upload records of a metadata transaction (``M`` and ``P`` keys, laid out in
``docs/metadata.md``): a mixin of :class:`tierd.meta.store.MetaTxn`, kept apart because
nothing else in the transaction's typed access touches them."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator

from tierd.meta.kv import KVTxn, prefix_end
from tierd.meta.records import MultipartUpload, UploadPart

#: what an upload id may look like (``secrets.token_urlsafe`` makes them; older stores' ids
#: fit too): checked before an id becomes a path or a key (the namespace, the peer door)
UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
#: S3 numbers parts 1 to 10,000 (the part's key packs its number in 4 bytes)
MAX_PART_NUMBER = 10000


class UploadRecords:
    """Uploads (``M<upload id>``) and their parts (``P<upload id>\\0<u32 number>``)."""

    kv: KVTxn

    def get_upload(self, upload_id: str) -> MultipartUpload | None:
        raw = self.kv.get(b"M" + upload_id.encode())
        return None if raw is None else MultipartUpload.decode(raw)

    def put_upload(self, upload: MultipartUpload) -> None:
        self.kv.put(b"M" + upload.upload_id.encode(), upload.encode())

    def delete_upload(self, upload_id: str) -> bool:
        return self.kv.delete(b"M" + upload_id.encode())

    def list_uploads(self) -> Iterator[MultipartUpload]:
        for _, raw in self.kv.scan(b"M", prefix_end(b"M")):
            yield MultipartUpload.decode(raw)

    @staticmethod
    def _part_prefix(upload_id: str) -> bytes:
        return b"P" + upload_id.encode() + b"\0"

    def put_part(self, upload_id: str, part: UploadPart) -> None:
        self.kv.put(self._part_prefix(upload_id) + struct.pack(">I", part.number), part.encode())

    def get_part(self, upload_id: str, number: int) -> UploadPart | None:
        raw = self.kv.get(self._part_prefix(upload_id) + struct.pack(">I", number))
        return None if raw is None else UploadPart.decode(raw)

    def list_parts(self, upload_id: str, after: int = 0) -> Iterator[UploadPart]:
        """Parts in number order, strictly after part ``after``."""
        prefix = self._part_prefix(upload_id)
        for _, raw in self.kv.scan(prefix + struct.pack(">I", after + 1), prefix_end(prefix)):
            yield UploadPart.decode(raw)

    def delete_parts(self, upload_id: str) -> int:
        prefix = self._part_prefix(upload_id)
        keys = [k for k, _ in self.kv.scan(prefix, prefix_end(prefix))]
        for k in keys:
            self.kv.delete(k)
        return len(keys)
