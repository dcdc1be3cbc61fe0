"""S3-compatible object storage: the connection settings, and the calls the sinks build their commits on.

Settings come from the usual AWS variables (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``) or an Airflow connection of the ``aws`` type; a sink
whose path is an ``s3://`` URL gets them in its config under ``s3`` (`S3Settings.to_config`), and no
other sink does. Data moves through pyarrow's `S3FileSystem`; the one call it lacks, a put that fails
when the object exists (``If-None-Match: *``, which S3 and the common S3 servers honour), goes through
boto3. Every error that leaves here names the object, never a credential.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from onceflow import redact
from onceflow.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

SCHEME = "s3://"
DEFAULT_REGION = "us-east-1"
_SECRET = {"secret": True}


def is_s3(path: object) -> bool:
    """Whether ``path`` names object storage (``s3://bucket/key``) rather than a local folder."""
    return isinstance(path, str) and path.startswith(SCHEME)


def uses_s3(config: Mapping[str, Any]) -> bool:
    """Whether any value of a sink config, at any depth, is an ``s3://`` URL: such a sink's tasks and
    committer need the credentials, and only they get them."""
    for value in config.values():
        if is_s3(value) or (isinstance(value, Mapping) and uses_s3(value)):
            return True
        if isinstance(value, list | tuple) and any(
            is_s3(v) or (isinstance(v, list | tuple) and any(is_s3(x) for x in v)) for v in value
        ):
            return True
    return False


def split(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` as ``("bucket", "a/b")``; a URL without a bucket is refused in one line."""
    if not is_s3(url):
        raise ConfigError(f"{url!r}: expected an s3://bucket/prefix URL")
    bucket, _, key = url[len(SCHEME) :].partition("/")
    if not bucket:
        raise ConfigError(f"{url!r}: an s3:// URL needs a bucket (s3://bucket/prefix)")
    return bucket, key.strip("/")


def join(url: str, *names: str) -> str:
    """``url`` with ``names`` appended, one ``/`` between each."""
    return "/".join([url.rstrip("/"), *(n.strip("/") for n in names if n)])


@dataclass(frozen=True, repr=False)
class S3Settings:
    """Where the object store is and who we are to it. ``endpoint_url`` None means AWS itself; an
    ``http://`` endpoint (a local server) is spoken to without TLS. The secret fields are masked by
    ``repr`` and by `redact` wherever a config holding them is printed."""

    endpoint_url: str | None = None
    region: str = DEFAULT_REGION
    access_key_id: str | None = field(default=None, metadata=_SECRET)
    secret_access_key: str | None = field(default=None, metadata=_SECRET)
    session_token: str | None = field(default=None, metadata=_SECRET)

    def __repr__(self) -> str:
        return redact.dataclass_repr(self)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Settings | None:
        """The AWS variables' settings, or None when none of them is set (no object storage configured:
        a sink with an ``s3://`` path then says so in one line)."""
        endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "").strip() or None
        key = (env.get("AWS_ACCESS_KEY_ID") or "").strip() or None
        region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "").strip() or None
        if endpoint is None and key is None and region is None:
            return None
        settings = cls(
            endpoint_url=endpoint,
            region=region or DEFAULT_REGION,
            access_key_id=key,
            secret_access_key=(env.get("AWS_SECRET_ACCESS_KEY") or "").strip() or None,
            session_token=(env.get("AWS_SESSION_TOKEN") or "").strip() or None,
        )
        settings.validate("AWS_ENDPOINT_URL")
        return settings

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> S3Settings:
        """The settings a sink config carries under ``s3`` (as `to_config` wrote them)."""
        if not isinstance(config, Mapping):
            raise ConfigError(f"{where} s3: expected a mapping of the object store's settings")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(f"{where} s3: unknown settings {unknown}; expected some of {sorted(known)}")
        values = {k: v for k, v in config.items() if v is not None}
        for key, value in values.items():
            if not isinstance(value, str) or not value:
                shown = redact.MASK if key in ("secret_access_key", "session_token") else repr(value)
                raise ConfigError(f"{where} s3.{key}={shown}: expected a non-empty string")
        settings = cls(**values)
        settings.validate(f"{where} s3.endpoint_url")
        return settings

    def validate(self, name: str) -> None:
        if self.endpoint_url is not None and not self.endpoint_url.startswith(("http://", "https://")):
            raise ConfigError(f"{name}={redact.url(self.endpoint_url)!r}: expected http(s)://host[:port]")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigError(
                "S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together; one is missing"
            )

    def to_config(self) -> dict[str, str]:
        """The settings as a sink config's ``s3`` entry (plain strings, for a Spark closure)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @property
    def _plain_http(self) -> bool:
        return self.endpoint_url is not None and self.endpoint_url.startswith("http://")

    def filesystem(self) -> pafs.S3FileSystem:
        """pyarrow's S3 filesystem for these settings (paths are then ``bucket/key``, no scheme)."""
        import pyarrow.fs as pafs

        options: dict[str, Any] = {"region": self.region}
        if self.endpoint_url is not None:
            options["endpoint_override"] = self.endpoint_url.split("://", 1)[1].rstrip("/")
            options["scheme"] = "http" if self._plain_http else "https"
        if self.access_key_id is not None:
            options.update(
                access_key=self.access_key_id,
                secret_key=self.secret_access_key,
                session_token=self.session_token,
            )
        return pafs.S3FileSystem(**options)

    def client(self) -> Any:
        """A boto3 S3 client for these settings (for `put_if_absent`; data goes through `filesystem`)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
            config=Config(retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"}),
        )

    def delta_options(self) -> dict[str, str]:
        """delta-rs ``storage_options``: commits through a conditional put, so that two writers of one
        table never both win a version (no locking service needed)."""
        options = {"AWS_REGION": self.region, "AWS_CONDITIONAL_PUT": "etag"}
        if self.endpoint_url is not None:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
            options["AWS_ALLOW_HTTP"] = "true" if self._plain_http else "false"
        if self.access_key_id is not None and self.secret_access_key is not None:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.session_token is not None:
            options["AWS_SESSION_TOKEN"] = self.session_token
        return options

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg FileIO properties (``s3.*``) for a warehouse in this store."""
        props = {"s3.region": self.region}
        if self.endpoint_url is not None:
            props["s3.endpoint"] = self.endpoint_url
        if self.access_key_id is not None and self.secret_access_key is not None:
            props["s3.access-key-id"] = self.access_key_id
            props["s3.secret-access-key"] = self.secret_access_key
        if self.session_token is not None:
            props["s3.session-token"] = self.session_token
        return props


class ObjectExists(Exception):
    """A conditional put found the object already there (someone wrote it first)."""


def put_if_absent(settings: S3Settings, url: str, data: bytes, client: Any = None) -> None:
    """Write ``data`` at ``url`` only if nothing is there: `ObjectExists` when something is. One request
    with ``If-None-Match: *``, which the store decides atomically, so of two writers exactly one wins."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split(url)
    s3 = client if client is not None else settings.client()
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            raise ObjectExists(url) from None
        raise OSError(f"S3 put of {url} failed: {redact.text(exc)}") from None
    except BotoCoreError as exc:
        raise OSError(f"S3 put of {url} failed: {redact.text(exc)}") from None


def delete_objects(settings: S3Settings, urls: list[str], client: Any = None) -> None:
    """Delete the objects at ``urls`` by name, a thousand a request; a missing one is no error. Unlike
    pyarrow's deletes, which put a folder object where the last object of a prefix went, this leaves
    nothing behind."""
    from botocore.exceptions import BotoCoreError, ClientError

    by_bucket: dict[str, list[str]] = {}
    for url in urls:
        bucket, key = split(url)
        by_bucket.setdefault(bucket, []).append(key)
    s3 = client if client is not None else settings.client()
    for bucket, keys in by_bucket.items():
        for at in range(0, len(keys), 1000):
            batch = [{"Key": key} for key in keys[at : at + 1000]]
            try:
                done = s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
            except (BotoCoreError, ClientError) as exc:
                raise OSError(f"S3 delete in {bucket} failed: {redact.text(exc)}") from None
            if done.get("Errors"):
                first = done["Errors"][0]
                raise OSError(f"S3 delete of s3://{bucket}/{first.get('Key')} failed: {first.get('Code')}")
