"""S3 errors: the code table (code -> HTTP status) and the one errno -> code mapping.

Handlers raise :class:`S3Error`; the namespace raises :class:`~tierd.errors.FsError`, which
:func:`from_fs_error` translates with :data:`ERRNO_CODES` (plus ``FsError.reason`` for the
object-only conditions no errno tells apart).  The middleware in :mod:`tierd.s3.app` turns
either into the ``<Error>`` XML document with the right status.
"""

from __future__ import annotations

import errno

from tierd.errors import FsError

#: every error code the gateway answers with, its HTTP status and default message
CODES: dict[str, tuple[int, str]] = {
    "AccessControlListNotSupported": (400, "The bucket does not allow ACLs"),
    "AccessDenied": (403, "Access Denied"),
    "AccessForbidden": (403, "CORSResponse: This CORS request is not allowed"),
    "AuthorizationHeaderMalformed": (400, "The authorization header is malformed"),
    "AuthorizationQueryParametersError": (400, "Error parsing the X-Amz-Credential parameter"),
    "BadRequest": (400, "Bad Request"),
    "BadDigest": (400, "The Content-MD5 or checksum you specified did not match what we "
                  "received"),
    "BucketAlreadyExists": (409, "The requested bucket name is not available: another user "
                            "owns it"),
    "BucketAlreadyOwnedByYou": (409, "Your previous request to create the named bucket "
                                "succeeded and you already own it"),
    "BucketNotEmpty": (409, "The bucket you tried to delete is not empty"),
    "EntityTooLarge": (400, "Your proposed upload exceeds the maximum allowed object size"),
    "EntityTooSmall": (400, "Your proposed upload is smaller than the minimum allowed "
                       "object size"),
    "IncompleteBody": (400, "You did not provide the number of bytes specified by the "
                       "Content-Length HTTP header"),
    "InsufficientStorage": (507, "There is not enough space left to store the object"),
    "InternalError": (500, "We encountered an internal error, please try again"),
    "InvalidAccessKeyId": (403, "The AWS access key Id you provided does not exist in our "
                           "records"),
    "InvalidArgument": (400, "Invalid Argument"),
    "InvalidBucketName": (400, "The specified bucket is not valid"),
    "InvalidDigest": (400, "The Content-MD5 you specified is not valid"),
    "InvalidPart": (400, "One or more of the specified parts could not be found"),
    "InvalidPartNumber": (416, "The requested partnumber is not satisfiable"),
    "InvalidPartOrder": (400, "The list of parts was not in ascending order"),
    "InvalidPolicyDocument": (400, "The content of the form does not meet the conditions "
                              "specified in the policy document."),
    "InvalidRange": (416, "The requested range is not satisfiable"),
    "InvalidRequest": (400, "Invalid Request"),
    "InvalidStorageClass": (400, "The storage class you specified is not valid"),
    "InvalidTag": (400, "The tag provided was not a valid tag"),
    "KeyTooLongError": (400, "Your key is too long"),
    "MalformedACLError": (400, "The XML you provided was not well-formed or did not "
                          "validate against our published schema"),
    "MalformedPOSTRequest": (400, "The body of your POST request is not well-formed "
                             "multipart/form-data."),
    "MalformedPolicy": (400, "Policies must be valid JSON and the first byte must be '{'"),
    "MalformedXML": (400, "The XML you provided was not well-formed or did not validate "
                     "against our published schema"),
    "MaxPostPreDataLengthExceeded": (400, "Your POST request fields preceding the upload "
                                     "file were too large."),
    "MetadataTooLarge": (400, "Your metadata headers exceed the maximum allowed metadata "
                         "size"),
    "MethodNotAllowed": (405, "The specified method is not allowed against this resource"),
    "MissingContentLength": (411, "You must provide the Content-Length HTTP header"),
    "NoSuchBucket": (404, "The specified bucket does not exist"),
    "NoSuchBucketPolicy": (404, "The bucket policy does not exist"),
    "NoSuchPublicAccessBlockConfiguration": (404, "The public access block configuration "
                                             "was not found"),
    "NoSuchCORSConfiguration": (404, "The CORS configuration does not exist"),
    "NoSuchKey": (404, "The specified key does not exist"),
    "NoSuchLifecycleConfiguration": (404, "The lifecycle configuration does not exist"),
    "NoSuchTagSet": (404, "The TagSet does not exist"),
    "NoSuchUpload": (404, "The specified multipart upload does not exist"),
    "NoSuchVersion": (404, "The specified version does not exist"),
    "NotImplemented": (501, "A header or query you provided implies functionality that is "
                       "not implemented"),
    "NotModified": (304, "Not Modified"),
    "OwnershipControlsNotFoundError": (404, "The bucket ownership controls were not found"),
    "PreconditionFailed": (412, "At least one of the pre-conditions you specified did not "
                           "hold"),
    "RequestTimeout": (400, "Your socket connection to the server was not read from or "
                       "written to within the timeout period"),
    "RequestTimeTooSkewed": (403, "The difference between the request time and the server's "
                             "time is too large"),
    "SignatureDoesNotMatch": (403, "The request signature we calculated does not match the "
                              "signature you provided. Check your key and signing method."),
    "ServiceUnavailable": (503, "The cold store cannot serve this data now; retry later"),
    "SlowDown": (503, "Please reduce your request rate"),
    "UnresolvableGrantByEmailAddress": (400, "The email address you provided does not "
                                        "match any account on record"),
    "XAmzContentSHA256Mismatch": (400, "The provided 'x-amz-content-sha256' header does not "
                                  "match what was computed"),
    # key <-> path conflicts (docs/semantics.md), named like MinIO's equivalents
    "XTierdParentIsObject": (409, "A prefix of the key is an object, so the key cannot "
                             "exist"),
    "XTierdObjectExistsAsDirectory": (409, "The key is a prefix of other keys (a directory), "
                                      "so it cannot also be an object"),
}


class S3Error(Exception):
    """An S3 error response: ``code`` from :data:`CODES`, a message, extra XML fields."""

    def __init__(self, code: str, message: str = "", *, status: int | None = None,
                 headers: dict[str, str] | None = None, **fields: str) -> None:
        default_status, default_message = CODES[code]
        self.code = code
        self.message = message or default_message
        self.status = status or default_status
        self.headers = headers or {}
        self.fields = fields
        super().__init__(f"{code}: {self.message}")


#: errno -> S3 code.  ENOENT and EEXIST depend on context (see :func:`from_fs_error`).
ERRNO_CODES: dict[int, str] = {
    errno.ENOENT: "NoSuchKey",
    errno.EACCES: "AccessDenied",
    errno.EPERM: "AccessDenied",
    errno.EROFS: "AccessDenied",
    errno.EINVAL: "InvalidArgument",
    errno.ENAMETOOLONG: "KeyTooLongError",
    errno.ENOTDIR: "XTierdParentIsObject",
    errno.EISDIR: "XTierdObjectExistsAsDirectory",
    errno.ENOTEMPTY: "BucketNotEmpty",
    errno.EEXIST: "BucketAlreadyExists",
    errno.ENOSPC: "InsufficientStorage",
    errno.EDQUOT: "InsufficientStorage",
    errno.EFBIG: "EntityTooLarge",
    errno.ELOOP: "InvalidArgument",
    errno.EMLINK: "InvalidArgument",
    errno.EBUSY: "SlowDown",
}


def from_fs_error(e: OSError, *, missing: str = "NoSuchKey", bucket: str = "",
                  key: str = "") -> S3Error:
    """The S3 error for a namespace failure.  ``missing`` is what ENOENT means here
    (NoSuchKey, NoSuchBucket, NoSuchUpload); an ``FsError.reason`` wins."""
    message = e.message if isinstance(e, FsError) else (e.strerror or str(e))
    reason = e.reason if isinstance(e, FsError) else None
    if reason is not None:
        code = reason.value  # each reason is named by its S3 code (tests/s3/test_unit.py)
    elif e.errno == errno.ENOENT:
        code = missing
    else:
        code = ERRNO_CODES.get(e.errno or 0, "InternalError")
    fields: dict[str, str] = {}
    if code in ("NoSuchBucket", "BucketNotEmpty", "BucketAlreadyExists",
                "BucketAlreadyOwnedByYou", "InvalidBucketName") and bucket:
        fields["BucketName"] = bucket
    if code in ("NoSuchKey", "KeyTooLongError", "XTierdParentIsObject",
                "XTierdObjectExistsAsDirectory") and key:
        fields["Key"] = key
    if code == "InternalError":
        message = f"{CODES[code][1]} ({message})"
    err = S3Error(code, message)
    err.fields.update(fields)
    return err
