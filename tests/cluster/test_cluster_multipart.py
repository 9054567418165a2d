"""Multipart uploads on a cluster: the parts are written to the hot tier of the node the
upload was created through, so its parts and its completion must go there; another node
refuses them with a clear S3 error (400 InvalidArgument naming the node), and listing and
aborting work on every node (tierd.namespace.multipart)."""

from __future__ import annotations

import os

import pytest
from botocore.exceptions import ClientError

from .clusterlib import Cluster

BUCKET = "mpu"
PART = 5 << 20


def test_an_upload_goes_to_its_node_and_others_say_so(cluster: Cluster) -> None:
    s1, s2 = cluster[1].s3(), cluster[2].s3()
    s1.create_bucket(Bucket=BUCKET)
    up = s1.create_multipart_upload(Bucket=BUCKET, Key="big")["UploadId"]
    data = [os.urandom(PART), os.urandom(1000)]
    with pytest.raises(ClientError) as e:
        s2.upload_part(Bucket=BUCKET, Key="big", UploadId=up, PartNumber=1, Body=data[0])
    err = e.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert err["Error"]["Code"] == "InvalidArgument" and "'n1'" in err["Error"]["Message"]
    etags = [s1.upload_part(Bucket=BUCKET, Key="big", UploadId=up, PartNumber=i + 1,
                            Body=d)["ETag"] for i, d in enumerate(data)]
    # listing its parts works anywhere (records only), completing only on n1
    assert [p["PartNumber"] for p in s2.list_parts(
        Bucket=BUCKET, Key="big", UploadId=up)["Parts"]] == [1, 2]
    parts = {"Parts": [{"PartNumber": i + 1, "ETag": t} for i, t in enumerate(etags)]}
    with pytest.raises(ClientError) as e:
        s2.complete_multipart_upload(Bucket=BUCKET, Key="big", UploadId=up,
                                     MultipartUpload=parts)
    assert e.value.response["Error"]["Code"] == "InvalidArgument"
    s1.complete_multipart_upload(Bucket=BUCKET, Key="big", UploadId=up, MultipartUpload=parts)
    assert s2.get_object(Bucket=BUCKET, Key="big")["Body"].read() == b"".join(data)
    # an abort through another node ends the upload everywhere
    up2 = s1.create_multipart_upload(Bucket=BUCKET, Key="dropped")["UploadId"]
    s3 = cluster[3].s3()
    s3.abort_multipart_upload(Bucket=BUCKET, Key="dropped", UploadId=up2)
    with pytest.raises(ClientError) as e:
        s1.upload_part(Bucket=BUCKET, Key="dropped", UploadId=up2, PartNumber=1, Body=b"x")
    assert e.value.response["Error"]["Code"] == "NoSuchUpload"
