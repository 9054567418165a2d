"""XML in and out: request bodies parsed with defusedxml (size-limited), responses built as
escaped strings (a 1,000-entry listing is a string join, not an element tree).

Request bodies are limited twice: in bytes (:data:`MAX_XML_BODY` when read, then per
document in :data:`BODY_LIMITS`) and in elements (:data:`ELEMENT_LIMITS`), so the code that
walks a parsed document never sees more than its request can legitimately hold.  DTDs,
entities and external references are refused outright (defusedxml): no billion laughs, no
file or network reads.  Every refusal is ``MalformedXML``, as S3 answers.
"""

from __future__ import annotations

import datetime
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from xml.sax.saxutils import escape

import defusedxml.ElementTree as DET
from defusedxml import DefusedXmlException

from tierd.s3.errors import S3Error

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEADER = '<?xml version="1.0" encoding="UTF-8"?>\n'
#: request bodies larger than this are refused (a 10,000-part Complete list is ~1.5 MB)
MAX_XML_BODY = 4 << 20
#: bytes per document root: DeleteObjects names at most 1,000 keys of at most 1,024 bytes
#: (a few escaped), CompleteMultipartUpload at most 10,000 parts with checksums; anything
#: else (CreateBucketConfiguration, versioning...) is a few hundred bytes
BODY_LIMITS = {"Delete": 2 << 20, "CompleteMultipartUpload": MAX_XML_BODY,
               "LifecycleConfiguration": 2 << 20}  # 1000 rules
SMALL_BODY = 64 << 10
#: elements per document root (Delete: 1,000 x Object/Key/VersionId...; Complete: 10,000 x
#: Part and its children); counts past these are refused before any handler walks the tree
ELEMENT_LIMITS = {"Delete": 1000 * 4 + 16, "CompleteMultipartUpload": 10000 * 10 + 16,
                  "LifecycleConfiguration": 1001 * 24 + 16,  # a rule has at most ~20
                  "CORSConfiguration": 8192}  # 100 rules of many headers within 64 KiB
SMALL_ELEMENTS = 256

# characters XML 1.0 cannot carry even as references; S3 keys may hold them
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def text(value: object) -> str:
    s = str(value)
    if _INVALID_XML.search(s):
        s = _INVALID_XML.sub(lambda m: f"&#x{ord(m.group()):x};", escape(s))
        return s
    return escape(s)


def el(tag: str, value: object) -> str:
    """``<tag>value</tag>`` with the value escaped."""
    return f"<{tag}>{text(value)}</{tag}>"


def els(pairs: Iterable[tuple[str, object | None]]) -> str:
    """Elements for the pairs whose value is not None."""
    return "".join(el(t, v) for t, v in pairs if v is not None)


def document(root: str, body: str) -> str:
    """A complete response document with the S3 namespace on its root element."""
    return f'{HEADER}<{root} xmlns="{S3_NS}">{body}</{root}>'


def iso8601(ns: int) -> str:
    """Timestamps in listings: ``2024-01-02T03:04:05.678Z``."""
    dt = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _strict(value: object) -> str:
    """Escaped text that is well-formed XML 1.0 whatever it holds: characters XML cannot
    carry at all (NUL, most controls, lone surrogates) become ``%XX`` / ``\\uXXXX`` --
    an error document must parse even when it names a key no listing could show."""
    s = str(value)
    if _INVALID_XML.search(s) or _SURROGATE.search(s):
        s = _INVALID_XML.sub(lambda m: f"%{ord(m.group()):02X}", s)
        s = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", s)
    return escape(s)


def error_document(code: str, message: str, resource: str, request_id: str,
                   fields: dict[str, str]) -> str:
    def e(tag: str, value: object) -> str:
        return f"<{tag}>{_strict(value)}</{tag}>"

    extra = "".join(e(k, v) for k, v in fields.items())
    return (f"{HEADER}<Error>{e('Code', code)}{e('Message', message)}{extra}"
            f"{e('Resource', resource)}{e('RequestId', request_id)}"
            f"{e('HostId', request_id)}</Error>")


# -- request bodies -----------------------------------------------------------------------

def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse(body: bytes, root: str) -> ET.Element:
    """Parse a request body whose root element must be ``root`` (namespace ignored).
    Entities, DTDs and external references are refused (defusedxml)."""
    limit = BODY_LIMITS.get(root, SMALL_BODY)
    if len(body) > limit:
        raise S3Error("MalformedXML", f"the XML body is larger than {limit} bytes")
    if not body.strip():
        raise S3Error("MalformedXML", "the request body is empty; an XML document is needed")
    try:
        doc: ET.Element = DET.fromstring(body, forbid_dtd=True)
    except (ET.ParseError, DefusedXmlException, ValueError, LookupError) as e:
        # LookupError: an encoding declaration Python does not know
        raise S3Error("MalformedXML", f"the XML body is not well-formed: {e}") from None
    if _local(doc.tag) != root:
        raise S3Error("MalformedXML", f"the XML root element must be <{root}>, "
                      f"not <{_local(doc.tag)}>")
    most = ELEMENT_LIMITS.get(root, SMALL_ELEMENTS)
    for n, _ in enumerate(doc.iter()):
        if n >= most:
            raise S3Error("MalformedXML", f"the <{root}> document has more than {most} "
                          "elements")
    return doc


def children(node: ET.Element, tag: str) -> list[ET.Element]:
    return [c for c in node if _local(c.tag) == tag]


def child_text(node: ET.Element, tag: str, default: str | None = None) -> str | None:
    for c in node:
        if _local(c.tag) == tag:
            return c.text or ""
    return default
