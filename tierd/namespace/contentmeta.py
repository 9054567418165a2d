"""Object metadata that describes one version of a file's bytes, and goes with it.

A door may store, next to the content type and user metadata, facts about the bytes
themselves: S3 additional checksums (``x-amz-checksum-*`` and their type) and the S3
door's own records of the content (``tierd.s3.*``: the multipart part layout, the upload
that made it).  When the bytes change through any other path -- a write or truncate on the
mount -- those facts are false, and a client that validates them (boto3, the aws cli) could
no longer download the object.  So every content change drops them in the transaction that
gives the file its new version; user metadata, the content type and the object's tags
(:mod:`tierd.namespace.tags`, which describe the object, not its bytes) stay, as on a file
rewritten in place.
"""

from __future__ import annotations

from tierd.meta import Inode

#: objmeta keys that describe the bytes (see the module doc)
CONTENT_PREFIXES = ("x-amz-checksum-", "tierd.s3.")


def forget_content_meta(inode: Inode) -> None:
    """Drop ``inode``'s metadata about its previous content (call where its version
    changes, before the inode is written)."""
    stale = [k for k in inode.objmeta if k.startswith(CONTENT_PREFIXES)]
    if stale:
        inode.objmeta = {k: v for k, v in inode.objmeta.items() if k not in stale}
