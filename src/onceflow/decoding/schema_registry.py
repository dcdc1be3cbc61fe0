"""Schema registries: where Avro writer schemas are found by id, and a subject's latest schema.

Decoders see a registry only through `SchemaRegistry`, so the same decoding runs against a real
registry (`HttpSchemaRegistry`, the common REST API that Confluent's registry, Apicurio's ``ccompat``
API and others serve) or against schemas kept in a folder (`FolderSchemaRegistry`, for deployments
without a registry and for tests). The two failures are kept apart on purpose: an id the registry does
not know is the record's fault (a dead letter), a registry that does not answer is nobody's record's
fault, so it aborts the epoch, which is replayed once the registry is back.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import io
import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from onceflow import redact
from onceflow.errors import ConfigError, OnceflowError, ServiceUnavailable, one_line

# The registry wire format of a record value: the magic byte 0, the 4-byte big-endian schema id, the body.
MAGIC_BYTE = 0
WIRE_HEADER = struct.Struct(">bI")
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
# The common API's codes for an unknown subject, version and schema: the only 404s that mean "no such
# schema"; any other 404 is a wrong URL, which must not turn good records into dead letters.
_NOT_FOUND_CODES = (40401, 40402, 40403)
# The most of an answer read: a schema is kilobytes, so more is a broken or hostile server.
MAX_ANSWER_BYTES = 1 << 20
# How long one call may take in all (connect, headers, body): the timeout is per socket operation, so a
# server trickling bytes would otherwise hold a call, and the slice with it, for ever.
DEADLINE_S = 30.0


def wire_value(schema_id: int, schema: Any, record: Mapping[str, Any]) -> bytes:
    """``record`` as an Avro body under ``schema`` (parsed by fastavro), framed in the wire format with
    ``schema_id``; fastavro's own error when the record does not fit the schema."""
    from fastavro import schemaless_writer

    out = io.BytesIO()
    out.write(WIRE_HEADER.pack(MAGIC_BYTE, schema_id))
    schemaless_writer(out, schema, dict(record))
    return out.getvalue()


class SchemaNotFound(OnceflowError):
    """The registry answered, and has no such schema id or subject."""


class RegistryUnavailable(ServiceUnavailable):
    """The registry did not answer usefully: the epoch cannot resolve its schemas and must not go on."""


@dataclass(frozen=True)
class RegisteredSchema:
    """One version of a subject: its global id, its version number and the schema's JSON text."""

    id: int
    version: int
    schema: str


class SchemaRegistry(Protocol):
    """What decoding needs of a registry."""

    def schema_by_id(self, schema_id: int) -> str:
        """The schema's JSON text; `SchemaNotFound` if the id is unknown."""
        ...

    def latest(self, subject: str) -> RegisteredSchema:
        """The subject's latest version; `SchemaNotFound` if the subject is unknown."""
        ...

    def versions(self, subject: str) -> list[RegisteredSchema]:
        """Every version of the subject, oldest first; `SchemaNotFound` if the subject is unknown."""
        ...


class HttpSchemaRegistry:
    """A registry reached over HTTP with the common REST API (stdlib only: it runs in Spark tasks too).

    ``url`` is the API's base, e.g. ``http://127.0.0.1:8081`` or ``http://host/apis/ccompat/v7``;
    credentials in it are sent as basic auth and never appear in a message, and only over https unless
    ``allow_insecure_auth``. A hostile or broken server cannot redirect the credentials elsewhere (no
    redirect is followed), fill the memory (an answer is at most `MAX_ANSWER_BYTES`) or hold a call
    (each ends within ``deadline_s``, ``timeout_s`` being each socket operation's).
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        deadline_s: float = DEADLINE_S,
        allow_insecure_auth: bool = False,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"schema registry URL {redact.url(url)!r}: expected http(s)://host[:port][/path]"
            )
        if insecure_auth(url) and not allow_insecure_auth:
            raise ConfigError(
                f"schema registry {redact.url(url)}: credentials over plain http would travel in clear "
                "text: use https, or set ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH=true"
            )
        self.url = url
        self.cache_key = url  # what a process caches this registry's schemas under
        self.shown = redact.url(url)
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        self._base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self._headers = {"Accept": _CONTENT_TYPE}
        if parts.username is not None:
            import base64

            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s

    def schema_by_id(self, schema_id: int) -> str:
        answer = self._call("GET", f"/schemas/ids/{int(schema_id)}", f"schema id {schema_id}")
        return _schema_text(answer, self.shown)

    def latest(self, subject: str) -> RegisteredSchema:
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
        answer = self._call("GET", path, f"subject {subject!r}")
        try:
            return RegisteredSchema(
                int(answer["id"]), int(answer["version"]), _schema_text(answer, self.shown)
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryUnavailable(
                f"schema registry {self.shown}: unexpected answer for {subject!r}"
            ) from exc

    def subjects(self) -> list[str]:
        """The registered subjects; `RegistryUnavailable` when the registry does not answer (a probe)."""
        answer = self._call("GET", "/subjects", "its subjects")
        if not isinstance(answer, list):
            raise RegistryUnavailable(f"schema registry {self.shown}: unexpected answer for its subjects")
        return [str(subject) for subject in answer]

    def versions(self, subject: str) -> list[RegisteredSchema]:
        quoted = urllib.parse.quote(subject, safe="")
        listed = self._call("GET", f"/subjects/{quoted}/versions", f"subject {subject!r}")
        if not isinstance(listed, list) or not all(isinstance(v, int) for v in listed):
            raise RegistryUnavailable(f"schema registry {self.shown}: unexpected answer for {subject!r}")
        found = []
        for version in sorted(listed):
            answer = self._call("GET", f"/subjects/{quoted}/versions/{version}", f"subject {subject!r}")
            try:
                found.append(RegisteredSchema(int(answer["id"]), version, _schema_text(answer, self.shown)))
            except (KeyError, TypeError, ValueError) as exc:
                raise RegistryUnavailable(
                    f"schema registry {self.shown}: unexpected answer for {subject!r}"
                ) from exc
        return found

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` (Avro JSON text) under ``subject``; its id (the same id if already there)."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        answer = self._call("POST", path, f"subject {subject!r}", {"schema": schema})
        try:
            return int(answer["id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryUnavailable(
                f"schema registry {self.shown}: unexpected answer for {subject!r}"
            ) from exc

    def _call(self, method: str, path: str, what: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self._headers, **({} if data is None else {"Content-Type": _CONTENT_TYPE}))
        request = urllib.request.Request(self._base + path, data=data, headers=headers, method=method)
        deadline = _Deadline(self.deadline_s)
        opener = urllib.request.build_opener(
            _NoRedirect, _DeadlineHttpHandler(deadline), _DeadlineHttpsHandler(deadline)
        )
        try:
            with opener.open(request, timeout=min(self.timeout_s, self.deadline_s)) as response:
                return json.loads(_bounded_read(response, deadline.at))
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                target = _without_credentials(
                    urllib.parse.urljoin(request.full_url, exc.headers["Location"] or "")
                )
                raise RegistryUnavailable(
                    f"schema registry {self.shown} redirected {what} to {target}: onceflow follows no "
                    "redirects, name the registry's own URL"
                ) from exc
            body = _error_body(exc)
            if exc.code == 404 and body.get("error_code") in _NOT_FOUND_CODES:
                raise SchemaNotFound(f"schema registry {self.shown} has no {what}") from exc
            if (
                exc.code == 404
            ):  # not the registry's own "not found": most likely a URL without the API's path
                raise RegistryUnavailable(
                    f"schema registry {self.shown} answered HTTP 404 for {what} without a registry error "
                    "code: is the URL the registry API's base (e.g. …/apis/ccompat/v7 for Apicurio)?"
                ) from exc
            message = one_line(body.get("message", exc.reason if isinstance(exc.reason, str) else ""))[:200]
            raise RegistryUnavailable(
                f"schema registry {self.shown} answered HTTP {exc.code} for {what}: {message}"
            ) from exc
        except _TooLarge as exc:
            raise RegistryUnavailable(
                f"schema registry {self.shown} answered more than {MAX_ANSWER_BYTES >> 20} MiB for {what}"
            ) from exc
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            if time.monotonic() >= deadline.at:
                raise RegistryUnavailable(
                    f"schema registry {self.shown} did not answer {what} within {self.deadline_s:g} s"
                ) from exc
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(
                f"schema registry {self.shown} is unreachable for {what}: {redact.text(one_line(reason))}"
            ) from exc
        finally:
            deadline.cancel()


class _TooLarge(Exception):
    """An answer past `MAX_ANSWER_BYTES`."""


class _Expired(OSError):
    """A call past its deadline."""


def _bounded_read(response: Any, deadline: float) -> bytes:
    """The answer's body, at most `MAX_ANSWER_BYTES`, read before ``deadline`` (`read1` returns what one
    socket read brings, so the deadline is checked however slowly the bytes come)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(65536):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise _TooLarge()
        if time.monotonic() >= deadline:
            raise _Expired()
        chunks.append(chunk)
    return b"".join(chunks)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the 3xx stays an `HTTPError`, so credentials never go to another URL."""

    def redirect_request(self, *args: Any) -> None:
        return None


class _Deadline:
    """One call's deadline: at it, the sockets of the call's connections are shut down, which ends a read
    blocked in connecting, in the headers or in the body, however the server trickles them."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self._timers: list[threading.Timer] = []

    def watch(self, connection: _DeadlineConnection) -> None:
        timer = threading.Timer(max(0.0, self.at - time.monotonic()), connection.expire)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()


class _DeadlineConnection:
    """Mixed into an HTTP(S) connection, whose socket a `_Deadline` shuts down (urllib drops the
    connection's own reference once the headers are read, the body's reader keeps the socket)."""

    sock: socket.socket | None

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._kept: socket.socket | None = None

    def connect(self) -> None:
        self._deadline.watch(self)
        super().connect()  # type: ignore[misc]
        self._kept = self.sock

    def expire(self) -> None:
        for sock in (self.sock, self._kept):
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed
                    sock.shutdown(socket.SHUT_RDWR)


class _HttpConnection(_DeadlineConnection, http.client.HTTPConnection):
    pass


class _HttpsConnection(_DeadlineConnection, http.client.HTTPSConnection):
    pass


class _DeadlineHttpHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HttpConnection, deadline=self.deadline), req)


class _DeadlineHttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_HttpsConnection, deadline=self.deadline)
        return self.do_open(connection, req, context=self._context)  # type: ignore[attr-defined]


def insecure_auth(url: str) -> bool:
    """Whether ``url`` would send credentials over plain http."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and parts.username is not None


def _without_credentials(url: str) -> str:
    """``url`` without its user, password, query and fragment: what a message may show of it."""
    parts = urllib.parse.urlsplit(url)
    try:
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    except ValueError:
        netloc = parts.hostname or ""
    return one_line(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")))[:200]


class FolderSchemaRegistry:
    """Schemas kept as ``.avsc`` files in a folder, with ids and subjects from its ``registry.json``.

    Not a registry server: nothing registers here, a person writes the files. The manifest reads
    ``{"schemas": [{"id": 1, "subject": "orders-value", "version": 1, "file": "orders-v1.avsc"}, ...]}``;
    a subject's latest is its highest version.
    """

    MANIFEST = "registry.json"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.cache_key = f"file://{self.folder.resolve()}"
        self._entries = self._manifest()

    def _manifest(self) -> list[tuple[int, str, int, str]]:
        """The manifest's (id, subject, version, file) entries, read now: a person may add a version to
        the folder while pipelines run, as a producer registers one in a registry server."""
        manifest = self.folder / self.MANIFEST
        try:
            entries = json.loads(manifest.read_text(encoding="utf-8"))["schemas"]
            return [(int(e["id"]), str(e["subject"]), int(e["version"]), str(e["file"])) for e in entries]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"schema folder {manifest}: expected a manifest "
                '{"schemas": [{"id", "subject", "version", "file"}, ...]} '
                f"({type(exc).__name__}: {one_line(exc)})"
            ) from exc

    def schema_by_id(self, schema_id: int) -> str:
        file = self._file_of(schema_id)
        if file is None:  # an id added since the manifest was read, or none at all
            self._entries = self._manifest()
            file = self._file_of(schema_id)
        if file is None:
            raise SchemaNotFound(f"schema folder {self.folder} has no schema id {schema_id}")
        return self._read(file)

    def _file_of(self, schema_id: int) -> str | None:
        return next((file for entry_id, _, _, file in self._entries if entry_id == schema_id), None)

    def latest(self, subject: str) -> RegisteredSchema:
        self._entries = self._manifest()  # once per slice: a new version is seen by the next one
        versions = [(v, i, f) for i, s, v, f in self._entries if s == subject]
        if not versions:
            raise SchemaNotFound(f"schema folder {self.folder} has no subject {subject!r}")
        version, schema_id, file = max(versions)
        return RegisteredSchema(schema_id, version, self._read(file))

    def versions(self, subject: str) -> list[RegisteredSchema]:
        self._entries = self._manifest()
        found = sorted((v, i, f) for i, s, v, f in self._entries if s == subject)
        if not found:
            raise SchemaNotFound(f"schema folder {self.folder} has no subject {subject!r}")
        return [RegisteredSchema(schema_id, version, self._read(file)) for version, schema_id, file in found]

    def _read(self, file: str) -> str:
        try:
            return (self.folder / file).read_text(encoding="utf-8")
        except OSError as exc:
            # The folder is the deployment's, like a registry server: a missing file is not a record's fault.
            raise RegistryUnavailable(
                f"schema folder {self.folder}: cannot read {file} ({one_line(exc)})"
            ) from exc


def registry_at(url: str | None, allow_insecure_auth: bool = False) -> SchemaRegistry | None:
    """The registry a deployment names (`onceflow.config.Settings.schema_registry_url`): ``http(s)://``
    for a registry server, ``file:///folder`` for a folder of schemas; None when none is named.
    ``allow_insecure_auth``: credentials may go over plain http
    (`onceflow.config.Settings.schema_registry_allow_insecure_auth`)."""
    if url is None:
        return None
    if url.startswith("file://"):
        return FolderSchemaRegistry(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    return HttpSchemaRegistry(url, allow_insecure_auth=allow_insecure_auth)


def _schema_text(answer: Any, shown: str) -> str:
    if not isinstance(answer, dict) or not isinstance(answer.get("schema"), str):
        raise RegistryUnavailable(f"schema registry {shown}: an answer without a schema")
    schema_type = answer.get("schemaType", "AVRO")
    if schema_type != "AVRO":
        raise SchemaNotFound(f"schema registry {shown}: the schema is {schema_type}, not Avro")
    return str(answer["schema"])


def _error_body(exc: urllib.error.HTTPError) -> dict[str, Any]:
    """The JSON error of a registry's answer (``{"error_code": …, "message": …}``), or {}."""
    try:
        body = json.loads(exc.read(MAX_ANSWER_BYTES + 1))
    except (ValueError, OSError, AttributeError, http.client.HTTPException):
        return {}
    return body if isinstance(body, dict) else {}
