"""The HTTP registry client: the requests it makes, what each answer becomes, and no secret in a message.

The server here is a stub that answers as the common REST API documents, to check the client's side
of the conversation; it is no registry.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from onceflow.config import Settings
from onceflow.decoding.schema_registry import (
    FolderSchemaRegistry,
    HttpSchemaRegistry,
    RegistryUnavailable,
    SchemaNotFound,
    registry_at,
)
from onceflow.errors import ConfigError

SCHEMA = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}'


class Stub(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str, str | None, Any]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, self.headers.get("Authorization"), None))
        if self.path == "/api/schemas/ids/5":
            self._answer(200, {"schema": SCHEMA})
        elif self.path == "/api/schemas/ids/6":
            self._answer(200, {"schema": "syntax = 'proto3';", "schemaType": "PROTOBUF"})
        elif self.path == "/api/subjects/orders%2Fvalue/versions/latest":
            self._answer(200, {"subject": "orders/value", "version": 3, "id": 5, "schema": SCHEMA})
        elif self.path == "/api/subjects":
            self._answer(200, ["orders/value"])
        elif self.path == "/other/subjects":  # a server that answers, but not as a registry does
            self._answer(200, {"subjects": []})
        elif self.path == "/api/subjects/orders%2Fvalue/versions":
            self._answer(200, [3, 1])
        elif self.path == "/api/subjects/orders%2Fvalue/versions/1":
            self._answer(200, {"subject": "orders/value", "version": 1, "id": 2, "schema": SCHEMA})
        elif self.path == "/api/subjects/orders%2Fvalue/versions/3":
            self._answer(200, {"subject": "orders/value", "version": 3, "id": 5, "schema": SCHEMA})
        elif self.path == "/api/schemas/ids/500":
            self._answer(500, {"error_code": 50001, "message": "storage\nfailed"})
        elif self.path.startswith("/api/"):
            self._answer(404, {"error_code": 40403, "message": "Schema not found"})
        else:  # outside the API: the server's own 404, no registry error code
            self._answer(404, {"title": "Could not find resource", "status": 404})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, self.headers.get("Content-Type"), body))
        self._answer(200, {"id": 9})


@pytest.fixture
def server() -> Iterator[str]:
    Stub.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_client_reads_by_id_and_latest_and_registers(server: str) -> None:
    client = HttpSchemaRegistry(f"http://user:pa%40ss@{server}/api/", allow_insecure_auth=True)
    assert client.schema_by_id(5) == SCHEMA
    latest = client.latest("orders/value")
    assert (latest.id, latest.version, latest.schema) == (5, 3, SCHEMA)
    assert client.register("orders/value", SCHEMA) == 9
    token = "Basic " + base64.b64encode(b"user:pa@ss").decode()
    assert Stub.seen == [
        ("GET", "/api/schemas/ids/5", token, None),
        ("GET", "/api/subjects/orders%2Fvalue/versions/latest", token, None),
        (
            "POST",
            "/api/subjects/orders%2Fvalue/versions",
            "application/vnd.schemaregistry.v1+json",
            {"schema": SCHEMA},
        ),
    ]


def test_a_subjects_versions_are_listed_oldest_first_with_their_ids(server: str) -> None:
    client = HttpSchemaRegistry(f"http://{server}/api")
    assert [(v.id, v.version) for v in client.versions("orders/value")] == [(2, 1), (5, 3)]
    assert [path for _, path, _, _ in Stub.seen] == [
        "/api/subjects/orders%2Fvalue/versions",
        "/api/subjects/orders%2Fvalue/versions/1",
        "/api/subjects/orders%2Fvalue/versions/3",
    ]
    with pytest.raises(SchemaNotFound):
        client.versions("nobody")


def test_unknown_ids_are_not_found_and_server_errors_are_unavailable_in_one_line(server: str) -> None:
    client = HttpSchemaRegistry(f"http://user:topsecret@{server}/api", allow_insecure_auth=True)
    with pytest.raises(SchemaNotFound, match="has no schema id 77"):
        client.schema_by_id(77)
    with pytest.raises(SchemaNotFound, match="PROTOBUF, not Avro"):
        client.schema_by_id(6)
    with pytest.raises(RegistryUnavailable) as raised:
        client.schema_by_id(500)
    message = str(raised.value)
    shown = f"http://user:***@{server}/api"
    assert message == f"schema registry {shown} answered HTTP 500 for schema id 500: storage; failed"


def test_subjects_is_the_probe_that_a_registry_answers(server: str) -> None:
    """What the suite's registry fixture asks first: an answer that is no subject list is no registry."""
    assert HttpSchemaRegistry(f"http://{server}/api").subjects() == ["orders/value"]
    with pytest.raises(RegistryUnavailable, match="unexpected answer for its subjects"):
        HttpSchemaRegistry(f"http://{server}/other").subjects()
    port = int(server.rpartition(":")[2])
    with pytest.raises(RegistryUnavailable, match="is unreachable for its subjects"):
        HttpSchemaRegistry(f"http://127.0.0.1:{closed_port(port)}/api", timeout_s=2).subjects()


def closed_port(not_this: int) -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    assert port != not_this
    return port


def test_a_url_without_the_apis_path_aborts_instead_of_dead_lettering(server: str) -> None:
    """A 404 without the registry's error code is a wrong URL: every id would look unknown."""
    with pytest.raises(
        RegistryUnavailable, match="without a registry error code: is the URL the registry API"
    ):
        HttpSchemaRegistry(f"http://{server}").schema_by_id(5)


def test_a_registry_is_named_by_its_url() -> None:
    assert isinstance(registry_at("http://127.0.0.1:8081"), HttpSchemaRegistry)
    assert registry_at(None) is None
    with pytest.raises(ConfigError, match=r"schema folder .*registry.json: expected a manifest"):
        registry_at("file:///nonexistent-onceflow-schemas")
    assert FolderSchemaRegistry.MANIFEST == "registry.json"


def test_settings_take_the_registry_url_and_refuse_other_schemes() -> None:
    settings = Settings.from_env({"ONCEFLOW_SCHEMA_REGISTRY_URL": " http://127.0.0.1:18081/apis/ccompat/v7 "})
    assert settings.schema_registry_url == "http://127.0.0.1:18081/apis/ccompat/v7"
    assert settings.as_env()["ONCEFLOW_SCHEMA_REGISTRY_URL"] == settings.schema_registry_url
    assert Settings.from_env({}).schema_registry_url is None
    assert "ONCEFLOW_SCHEMA_REGISTRY_URL" not in Settings.from_env({}).as_env()
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"ONCEFLOW_SCHEMA_REGISTRY_URL": "ftp://u:hidden@host/x"})
    assert "hidden" not in str(raised.value) and "ONCEFLOW_SCHEMA_REGISTRY_URL=" in str(raised.value)


class Hostile(BaseHTTPRequestHandler):
    """A server that answers every request badly, in the way its path names."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        port = self.server.server_address[1]
        if self.path.startswith("/redirect/schemas"):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{port}/taken/schemas/ids/5?token=abc")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith("/taken/"):
            data = json.dumps({"schema": SCHEMA}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path.startswith("/huge/"):  # 2 MiB of a valid JSON answer, without a length
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            piece = b" " * 65536
            for chunk in [b'{"schema": "x"'] + [piece] * 32 + [b"}"]:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.startswith("/hugeerror/"):  # a 2 MiB error body
            data = b'{"message": "' + b"y" * (2 << 20) + b'"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path.startswith("/trickle/"):  # one byte a second, each well within the read timeout
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(1000):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
        elif self.path.startswith("/slowheaders/"):  # the headers themselves, one byte at a time
            try:
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"z" * 1000:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass


@pytest.fixture
def hostile() -> Iterator[str]:
    Hostile.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_redirect_is_refused_naming_where_without_credentials(hostile: str) -> None:
    url = f"http://user:topsecret@{hostile}/redirect"
    client = HttpSchemaRegistry(url, timeout_s=2, allow_insecure_auth=True)
    with pytest.raises(RegistryUnavailable) as raised:
        client.schema_by_id(5)
    message = str(raised.value)
    assert message == (
        f"schema registry http://user:***@{hostile}/redirect redirected schema id 5 to "
        f"http://{hostile}/taken/schemas/ids/5: onceflow follows no redirects, name the registry's own URL"
    )
    assert [path for path, _ in Hostile.seen] == ["/redirect/schemas/ids/5"]  # never followed


def test_an_answer_over_1_mib_is_refused_in_one_line(hostile: str) -> None:
    client = HttpSchemaRegistry(f"http://{hostile}/huge", timeout_s=2)
    with pytest.raises(RegistryUnavailable) as raised:
        client.schema_by_id(5)
    assert str(raised.value) == (
        f"schema registry http://{hostile}/huge answered more than 1 MiB for schema id 5"
    )
    with pytest.raises(RegistryUnavailable, match="answered HTTP 500 for schema id 5") as raised:
        HttpSchemaRegistry(f"http://{hostile}/hugeerror", timeout_s=2).schema_by_id(5)
    assert len(str(raised.value)) < 400


def test_a_trickling_answer_is_cut_at_the_calls_deadline(hostile: str) -> None:
    client = HttpSchemaRegistry(f"http://{hostile}/trickle", timeout_s=2, deadline_s=1.5)
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable) as raised:
        client.schema_by_id(5)
    assert time.monotonic() - started < 5
    assert str(raised.value) == (
        f"schema registry http://{hostile}/trickle did not answer schema id 5 within 1.5 s"
    )
    with pytest.raises(RegistryUnavailable, match=r"did not answer subject 'a' within 1\.5 s"):
        HttpSchemaRegistry(f"http://{hostile}/slowheaders", timeout_s=2, deadline_s=1.5).latest("a")
    assert time.monotonic() - started < 10
    assert HttpSchemaRegistry(f"http://{hostile}/x").deadline_s == 30


def test_basic_auth_over_plain_http_is_refused_unless_allowed(server: str) -> None:
    with pytest.raises(ConfigError) as raised:
        HttpSchemaRegistry(f"http://user:topsecret@{server}/api")
    assert str(raised.value) == (
        f"schema registry http://user:***@{server}/api: credentials over plain http would travel in "
        "clear text: use https, or set ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH=true"
    )
    HttpSchemaRegistry(f"https://user:topsecret@{server}/api")
    HttpSchemaRegistry(f"http://{server}/api")
    allowed = HttpSchemaRegistry(f"http://user:topsecret@{server}/api", allow_insecure_auth=True)
    assert allowed.schema_by_id(5) == SCHEMA
    assert registry_at(f"http://user:pw@{server}/api", allow_insecure_auth=True) is not None
    with pytest.raises(ConfigError, match="ALLOW_INSECURE_AUTH"):
        registry_at(f"http://user:pw@{server}/api")


def test_settings_refuse_registry_credentials_over_http_unless_allowed() -> None:
    url = "http://user:topsecret@127.0.0.1:18081/api"
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"ONCEFLOW_SCHEMA_REGISTRY_URL": url})
    assert "topsecret" not in str(raised.value)
    assert "ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH=true" in str(raised.value)
    allowed = Settings.from_env(
        {"ONCEFLOW_SCHEMA_REGISTRY_URL": url, "ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH": "true"}
    )
    assert allowed.schema_registry_allow_insecure_auth
    assert allowed.as_env()["ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH"] == "true"
    assert Settings.from_env(allowed.as_env()) == allowed
    assert not Settings.from_env(
        {"ONCEFLOW_SCHEMA_REGISTRY_URL": "https://u:p@host/api"}
    ).schema_registry_allow_insecure_auth
    with pytest.raises(ConfigError, match="ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH='maybe'"):
        Settings.from_env({"ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH": "maybe"})
