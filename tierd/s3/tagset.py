"""Tag sets at the S3 door: the ``x-amz-tagging`` header, ``<Tagging>`` documents, and S3's
limits on both.

Parsing lives apart from the handlers (:mod:`tierd.s3.tagging`) because the bucket-policy
side (:mod:`tierd.s3.access`, the ``s3:RequestObjectTag/<key>`` condition keys) and the
object writes (:func:`tierd.s3.common.objmeta_from_headers`, CopyObject) read the same
header.  Limits and error codes are AWS's: at most 10 tags on an object and 50 on a bucket,
keys of 1 to 128 and values of at most 256 Unicode characters, no key twice, no key starting
``aws:`` (all ``InvalidTag``); a header that is not a URL-encoded UTF-8 query string is
``InvalidArgument``, a document that does not parse or lacks its elements ``MalformedXML``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote_to_bytes

from tierd.namespace.api import TAGS_META, Tags, decode_tags, encode_tags
from tierd.s3 import xmlio
from tierd.s3.errors import S3Error
from tierd.s3.xmlio import document, el

HEADER = "x-amz-tagging"
DIRECTIVE = "x-amz-tagging-directive"
COUNT_HEADER = "x-amz-tagging-count"
MAX_OBJECT_TAGS = 10
MAX_BUCKET_TAGS = 50
MAX_KEY_CHARS = 128
MAX_VALUE_CHARS = 256
#: a ``%`` not followed by two hex digits: not URL encoding
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def check(tags: Tags, most: int = MAX_OBJECT_TAGS, what: str = "Object") -> Tags:
    """``tags`` when they are within S3's limits, else ``InvalidTag``."""
    if len(tags) > most:
        raise S3Error("InvalidTag", f"{what} tags cannot be greater than {most}")
    seen: set[str] = set()
    for key, value in tags:
        if not key:
            raise S3Error("InvalidTag", "The TagKey you have provided is invalid",
                          TagKey=key)
        if len(key) > MAX_KEY_CHARS:
            raise S3Error("InvalidTag", f"The TagKey you have provided is too long, max "
                          f"{MAX_KEY_CHARS}", TagKey=key)
        if len(value) > MAX_VALUE_CHARS:
            raise S3Error("InvalidTag", f"The TagValue you have provided is too long, max "
                          f"{MAX_VALUE_CHARS}", TagKey=key, TagValue=value)
        if key.lower().startswith("aws:"):
            raise S3Error("InvalidTag", "Your TagKey cannot be prefixed with aws:",
                          TagKey=key)
        if key in seen:
            raise S3Error("InvalidTag", "Cannot provide multiple Tags with the same key",
                          TagKey=key)
        seen.add(key)
    return tags


def _bad_header(value: str) -> S3Error:
    return S3Error("InvalidArgument", f"The header '{HEADER}' shall be encoded as UTF-8 then "
                   "URLEncoded URL query parameters without tag name duplicates.",
                   ArgumentName=HEADER, ArgumentValue=value)


def parse_header(value: str) -> Tags:
    """The tags of an ``x-amz-tagging`` value (``k1=v1&k2=v2``, ``+`` a space, a key
    without ``=`` an empty value); InvalidArgument when it is not URL-encoded UTF-8 or
    names a key twice, InvalidTag past the limits."""
    if _BAD_PERCENT.search(value):
        raise _bad_header(value)
    tags: Tags = []
    for piece in value.split("&"):
        if not piece:
            continue
        raw_key, _, raw_value = piece.partition("=")
        try:
            key, val = (unquote_to_bytes(s.replace("+", " ")).decode("utf-8")
                        for s in (raw_key, raw_value))
        except UnicodeError:  # not UTF-8 once decoded, or raw bytes that are not
            raise _bad_header(value) from None
        tags.append((key, val))
    if len({k for k, _ in tags}) != len(tags):
        raise _bad_header(value)
    return check(tags)


def request_tags(headers: Mapping[str, str]) -> Tags | None:
    """The tags of the request's ``x-amz-tagging`` header; None without one."""
    value = headers.get(HEADER)
    return None if value is None else parse_header(value)


def header_meta(headers: Mapping[str, str]) -> dict[str, str]:
    """The objmeta entry of a write's ``x-amz-tagging`` (PutObject, CreateMultipartUpload,
    CopyObject); empty without the header or with no tags in it."""
    tags = request_tags(headers)
    return {TAGS_META: encode_tags(tags)} if tags else {}


def copy_tags(headers: Mapping[str, str], src_meta: Mapping[str, str],
              meta: dict[str, str]) -> dict[str, str]:
    """``meta`` of a CopyObject's target with its tags chosen by ``x-amz-tagging-directive``:
    COPY (the default) keeps the source's, REPLACE takes the request's header (none without
    it); anything else is InvalidArgument."""
    directive = headers.get(DIRECTIVE, "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error("InvalidArgument", "Unknown tagging directive.",
                      ArgumentName=DIRECTIVE, ArgumentValue=directive)
    out = {k: v for k, v in meta.items() if k != TAGS_META}
    chosen = (src_meta.get(TAGS_META) if directive == "COPY"
              else header_meta(headers).get(TAGS_META))
    if chosen:
        out[TAGS_META] = chosen
    return out


def tag_count(objmeta: Mapping[str, str]) -> int:
    """How many tags an object's metadata holds (``x-amz-tagging-count``)."""
    return len(decode_tags(objmeta.get(TAGS_META, "")))


# -- <Tagging> documents ------------------------------------------------------------------

def parse_document(raw: bytes, most: int = MAX_OBJECT_TAGS, what: str = "Object") -> Tags:
    """The tags of a ``<Tagging><TagSet><Tag><Key/><Value/></Tag>...`` body."""
    doc = xmlio.parse(raw, "Tagging")
    sets = xmlio.children(doc, "TagSet")
    if len(sets) != 1:
        raise S3Error("MalformedXML", "<Tagging> must hold exactly one <TagSet>")
    tags: Tags = []
    for tag in sets[0]:
        if tag.tag.rsplit("}", 1)[-1] != "Tag":
            raise S3Error("MalformedXML", "<TagSet> may hold only <Tag> elements")
        key = xmlio.child_text(tag, "Key")
        value = xmlio.child_text(tag, "Value")
        if key is None or value is None:
            raise S3Error("MalformedXML", "every <Tag> needs a <Key> and a <Value>")
        tags.append((key, value))
    return check(tags, most, what)


def tagging_document(tags: Tags) -> str:
    """The ``<Tagging>`` answer of GetObjectTagging and GetBucketTagging."""
    rows = "".join(f"<Tag>{el('Key', k)}{el('Value', v)}</Tag>" for k, v in tags)
    return document("Tagging", f"<TagSet>{rows}</TagSet>")
