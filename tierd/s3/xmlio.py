"""XML in and out: request bodies parsed with defusedxml (size-limited), responses built as
escaped strings (a 1,000-entry listing is a string join, not an element tree)."""

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

# characters XML 1.0 cannot carry even as references; S3 keys may hold them
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


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


def error_document(code: str, message: str, resource: str, request_id: str,
                   fields: dict[str, str]) -> str:
    extra = "".join(el(k, v) for k, v in fields.items())
    return (f"{HEADER}<Error>{el('Code', code)}{el('Message', message)}{extra}"
            f"{el('Resource', resource)}{el('RequestId', request_id)}"
            f"{el('HostId', request_id)}</Error>")


# -- request bodies -----------------------------------------------------------------------

def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse(body: bytes, root: str) -> ET.Element:
    """Parse a request body whose root element must be ``root`` (namespace ignored).
    Entities, DTDs and external references are refused (defusedxml)."""
    if len(body) > MAX_XML_BODY:
        raise S3Error("MalformedXML", f"the XML body is larger than {MAX_XML_BODY} bytes")
    if not body.strip():
        raise S3Error("MalformedXML", "the request body is empty; an XML document is needed")
    try:
        doc: ET.Element = DET.fromstring(body, forbid_dtd=True)
    except (ET.ParseError, DefusedXmlException, ValueError) as e:
        raise S3Error("MalformedXML", f"the XML body is not well-formed: {e}") from None
    if _local(doc.tag) != root:
        raise S3Error("MalformedXML", f"the XML root element must be <{root}>, "
                      f"not <{_local(doc.tag)}>")
    return doc


def children(node: ET.Element, tag: str) -> list[ET.Element]:
    return [c for c in node if _local(c.tag) == tag]


def child_text(node: ET.Element, tag: str, default: str | None = None) -> str | None:
    for c in node:
        if _local(c.tag) == tag:
            return c.text or ""
    return default
