"""Bucket configuration documents: stored in the bucket record, durable, per bucket."""

from __future__ import annotations

import errno

from namespace.conftest import NsEnv
from tierd.namespace.bucketconf import MAX_CONFIG_BYTES


def test_documents_survive_a_reopen_and_stay_per_bucket(nsenv: NsEnv) -> None:
    nsenv.bucket("aaa")
    nsenv.bucket("bbb")
    conf = nsenv.ns.bucket_config
    assert conf.get("aaa", "cors") is None
    assert nsenv.run(conf.put("aaa", "cors", "<CORSConfiguration/>"))
    assert not nsenv.run(conf.put("aaa", "cors", "<CORSConfiguration/>"))  # unchanged
    assert nsenv.run(conf.put("aaa", "versioning", "Enabled"))
    assert conf.get("bbb", "cors") is None

    conf = nsenv.reopen().bucket_config
    assert conf.all("aaa") == {"cors": "<CORSConfiguration/>", "versioning": "Enabled"}
    assert nsenv.run(conf.put("aaa", "cors", None))
    assert not nsenv.run(conf.put("aaa", "cors", None))
    assert conf.all("aaa") == {"versioning": "Enabled"}
    nsenv.err(errno.ENOENT, conf.put("nope", "cors", "x"))
    nsenv.err(errno.EFBIG, conf.put("aaa", "cors", "x" * (MAX_CONFIG_BYTES + 1)))
