"""What the tests of sinks in a bucket share: the stack's bucket, a pyarrow file system made from the AWS
variables alone, and listing or emptying a prefix through boto3, so that what a test finds in the bucket
is what the S3 server holds."""

from __future__ import annotations

import os
from typing import Any

from onceflow.storage.s3 import S3Settings

BUCKET = os.environ.get("ONCEFLOW_S3_BUCKET", "onceflow")


def bucket_fs() -> Any:
    """pyarrow's S3 file system, made from the AWS variables here (not through onceflow's settings)."""
    from pyarrow import fs as pafs

    scheme, _, endpoint = os.environ["AWS_ENDPOINT_URL"].partition("://")
    return pafs.S3FileSystem(
        endpoint_override=endpoint,
        scheme=scheme,
        region=os.environ.get("AWS_REGION", "us-east-1"),
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    )


def all_keys(s3: S3Settings, url: str) -> list[str]:
    """Every object key under an s3:// URL, as the S3 server lists it (folder placeholders included)."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key.rstrip("/") + "/")
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def objects(s3: S3Settings, url: str) -> list[str]:
    """The keys of the objects under an s3:// URL. Keys ending in ``/`` are left out: they are the
    empty folder placeholders that pyarrow's S3 file system writes for the parent of a deleted object,
    and hold nothing."""
    return [k for k in all_keys(s3, url) if not k.endswith("/")]


def empty_prefix(s3: S3Settings, url: str) -> None:
    """Delete everything under ``url``: objects first, then folder placeholders, deepest first (a
    POSIX-backed server refuses to delete a folder that still holds something)."""
    bucket = url.removeprefix("s3://").partition("/")[0]
    client = s3.client()
    for key in sorted(all_keys(s3, url), key=lambda k: (k.endswith("/"), -k.count("/"))):
        client.delete_object(Bucket=bucket, Key=key)
