"""Debezium's PostgreSQL connector on the stack's Kafka Connect (infra/connect.sh), for the CDC tests.

``register_postgres_connector`` creates a publication for the given tables and registers a connector
(pgoutput, its own replication slot and topic prefix) in one of three serializations: JSON with its
schemas, JSON without, or Avro through the stack's schema registry (Apicurio's converter, writing the
common wire format: magic byte, then the schema's 4-byte id, which the registry's Confluent-compatible
API resolves). ``ChangeReader`` reads a change topic back and decodes each record as the serialization
wrote it; ``CdcConnector.delete`` removes the connector, its replication slot and its publication.
Everything talks to Kafka Connect's REST API with urllib.
"""

from __future__ import annotations

import io
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from onceflow.config import Settings

SERIALIZATIONS = ("json", "json-schemaless", "avro")
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
APICURIO_AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"


class ConnectError(RuntimeError):
    """Kafka Connect answered with an error, or a connector did not get where it was asked to."""


def connect_url() -> str:
    url = os.environ.get("ONCEFLOW_CONNECT_URL")
    if not url:
        raise ConnectError(
            'ONCEFLOW_CONNECT_URL not set: run `eval "$(make -s services)"` (or infra/connect.sh start) first'
        )
    return url.rstrip("/")


def request(
    method: str, path: str, body: Any = None, *, url: str | None = None, timeout_s: float = 30
) -> Any:
    """One call of Kafka Connect's REST API; its JSON answer (None for an empty one)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{url or connect_url()}{path}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as answer:
            text = answer.read()
    except urllib.error.HTTPError as exc:
        raise ConnectError(f"{method} {path}: HTTP {exc.code} {exc.read().decode(errors='replace')}") from exc
    return json.loads(text) if text.strip() else None


def registry_v2_url(ccompat_url: str) -> str:
    """The registry's own v2 API (Apicurio's 2.6 converter speaks it) beside its Confluent-compatible one."""
    base, sep, _ = ccompat_url.partition("/apis/")
    if not sep:
        raise ConnectError(f"{ccompat_url} is not an Apicurio Registry URL (.../apis/ccompat/v7)")
    return f"{base}/apis/registry/v2"


def converter_config(serialization: str, registry_url: str | None = None) -> dict[str, str]:
    """Key and value converter settings of a connector, for one of SERIALIZATIONS."""
    if serialization in ("json", "json-schemaless"):
        schemas = "true" if serialization == "json" else "false"
        return {
            "key.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": schemas,
            "value.converter": JSON_CONVERTER,
            "value.converter.schemas.enable": schemas,
        }
    if serialization != "avro":
        raise ValueError(f"serialization {serialization!r}: one of {SERIALIZATIONS}")
    if not registry_url:
        raise ConnectError("Avro needs the schema registry: ONCEFLOW_SCHEMA_REGISTRY_URL is not set")
    config: dict[str, str] = {}
    for side in ("key", "value"):
        config |= {
            f"{side}.converter": APICURIO_AVRO_CONVERTER,
            f"{side}.converter.apicurio.registry.url": registry_v2_url(registry_url),
            f"{side}.converter.apicurio.registry.auto-register": "true",
            # The schema id in the record (not in headers), 4 bytes after a magic byte, and the id the
            # Confluent-compatible API knows a schema by (its content id).
            f"{side}.converter.apicurio.registry.headers.enabled": "false",
            f"{side}.converter.apicurio.registry.as-confluent": "true",
            f"{side}.converter.apicurio.registry.use-id": "contentId",
        }
    return config


@dataclass
class CdcConnector:
    """A registered Debezium PostgreSQL connector and what it owns in PostgreSQL."""

    name: str
    topic_prefix: str
    slot: str
    publication: str
    pg_dsn: str
    serialization: str
    config: dict[str, str] = field(repr=False)

    def topic(self, table: str, schema: str = "public") -> str:
        return f"{self.topic_prefix}.{schema}.{table}"

    @property
    def transaction_topic(self) -> str:
        return f"{self.topic_prefix}.transaction"

    def status(self) -> dict[str, Any]:
        answer: dict[str, Any] = request("GET", f"/connectors/{self.name}/status")
        return answer

    def wait_running(self, timeout_s: float = 60) -> None:
        """Until the connector and its task run; a failed one raises with the worker's trace."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                status = self.status()
            except ConnectError:  # not known yet right after the config was put
                time.sleep(0.5)
                continue
            states = [status["connector"]["state"]] + [task["state"] for task in status.get("tasks", [])]
            if "FAILED" in states:
                traces = [t.get("trace", "") for t in [status["connector"], *status.get("tasks", [])]]
                raise ConnectError(f"connector {self.name} failed: {' '.join(traces)[:4000]}")
            if status.get("tasks") and set(states) == {"RUNNING"}:
                return
            time.sleep(0.5)
        raise ConnectError(f"connector {self.name} not running after {timeout_s}s: {status}")

    def delete(self, timeout_s: float = 60) -> None:
        """Remove the connector, then its replication slot (once the worker let go of it) and publication."""
        import psycopg

        try:
            request("DELETE", f"/connectors/{self.name}")
        except ConnectError as exc:
            if "404" not in str(exc):
                raise
        deadline = time.monotonic() + timeout_s
        while self.name in request("GET", "/connectors") and time.monotonic() < deadline:
            time.sleep(0.5)
        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
                ).fetchone()
                if row is None:
                    break
                if not row[0]:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
                    break
                if time.monotonic() > deadline:
                    raise ConnectError(f"replication slot {self.slot} still in use after {timeout_s}s")
                time.sleep(0.5)
            conn.execute(f'DROP PUBLICATION IF EXISTS "{self.publication}"')


def register_postgres_connector(
    pg_dsn: str,
    tables: list[str],
    serialization: str,
    *,
    registry_url: str | None = None,
    transaction_metadata: bool = False,
    extra: dict[str, str] | None = None,
    prefix: str = "cdc",
) -> CdcConnector:
    """Create a publication for ``tables`` (``schema.table``) and register a connector capturing them
    from their current rows on (an initial snapshot, then the stream), with its own slot and topics.
    ``prefix`` starts the names; another than ``cdc`` keeps them out of `remove_leftovers`' reach."""
    import psycopg
    from examples.cdc_mirror.source import connector_config

    suffix = uuid.uuid4().hex[:10]
    kind = serialization.replace("-", "_")
    slot = publication = f"onceflow_{prefix}_{kind}_{suffix}"
    name = f"{prefix}-{serialization}-{suffix}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        listed = ", ".join(".".join(f'"{part}"' for part in table.split(".")) for table in tables)
        conn.execute(f'CREATE PUBLICATION "{publication}" FOR TABLE {listed}')
    base = connector_config(
        pg_dsn,
        prefix=name,
        tables=tables,
        slot=slot,
        publication=publication,
        transactions=transaction_metadata,
    )
    config = {
        **base,
        # Truncates are left out by default; a decoder must see them.
        "skipped.operations": "none",
        "tombstones.on.delete": "true",
        **converter_config(serialization, registry_url),
        **(extra or {}),
    }
    connector = CdcConnector(name, name, slot, publication, pg_dsn, serialization, config)
    try:
        request("PUT", f"/connectors/{name}/config", config)
    except Exception:
        connector.delete()
        raise
    return connector


def remove_leftovers(pg_dsn: str) -> list[str]:
    """Connectors, slots and publications that an interrupted run of these helpers left (the names they
    give): a forgotten slot keeps the server's WAL forever. Returns what went."""
    import psycopg

    gone: list[str] = []
    for name in request("GET", "/connectors"):
        if name.startswith("cdc-"):
            request("DELETE", f"/connectors/{name}")
            gone.append(name)
    deadline = time.monotonic() + 30
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT slot_name, active FROM pg_replication_slots WHERE slot_name LIKE 'onceflow_cdc_%'"
            ).fetchall()
            for slot, active in rows:
                if not active:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    gone.append(slot)
            if all(not active for _, active in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for (publication,) in conn.execute(
            "SELECT pubname FROM pg_publication WHERE pubname LIKE 'onceflow_cdc_%'"
        ).fetchall():
            conn.execute(f'DROP PUBLICATION "{publication}"')
            gone.append(publication)
    return gone


@dataclass
class Change:
    """One record of a change topic: its raw key and value, and both decoded (None for a null/tombstone)."""

    raw_key: bytes | None
    raw_value: bytes | None
    key: Any
    value: Any
    schema_ids: tuple[int | None, int | None] = (None, None)

    @property
    def envelope(self) -> dict[str, Any] | None:
        """Debezium's envelope (before, after, op, source, ...), without JSON's schema wrapper."""
        if self.value is None:
            return None
        if isinstance(self.value, dict) and set(self.value) == {"schema", "payload"}:
            payload: dict[str, Any] = self.value["payload"]
            return payload
        envelope: dict[str, Any] = self.value
        return envelope


class ChangeReader:
    """Reads a topic from its start with confluent_kafka and decodes each record for a serialization."""

    def __init__(self, bootstrap: str, topic: str, serialization: str, registry_url: str | None = None):
        from confluent_kafka import Consumer

        self.topic = topic
        self.serialization = serialization
        self._registry_url = registry_url
        self._schemas: dict[int, Any] = {}
        self.writer_schemas: dict[int, str] = {}
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"cdc-test-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self._assigned = False

    def _assign(self, deadline: float) -> bool:
        from confluent_kafka import TopicPartition

        if self._assigned:
            return True
        metadata = self._consumer.list_topics(self.topic, timeout=5)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            return False
        self._consumer.assign([TopicPartition(self.topic, p, 0) for p in sorted(topic.partitions)])
        self._assigned = True
        return True

    def read(self, count: int, timeout_s: float = 60) -> list[Change]:
        """The next ``count`` records; fewer within ``timeout_s`` raises, naming what did arrive."""
        deadline = time.monotonic() + timeout_s
        changes: list[Change] = []
        while len(changes) < count:
            if time.monotonic() > deadline:
                seen = [c.envelope.get("op") if c.envelope else None for c in changes]
                raise ConnectError(
                    f"{self.topic}: {len(changes)} of {count} records in {timeout_s}s (ops {seen})"
                )
            if not self._assign(deadline):
                time.sleep(0.5)
                continue
            message = self._consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise ConnectError(f"{self.topic}: {message.error()}")
            changes.append(self.decode(message.key(), message.value()))
        return changes

    def read_until(self, done: Any, timeout_s: float = 60) -> list[Change]:
        """Records until one for which ``done(change)`` holds (included)."""
        changes: list[Change] = []
        deadline = time.monotonic() + timeout_s
        while not changes or not done(changes[-1]):
            changes += self.read(1, timeout_s=max(0.1, deadline - time.monotonic()))
        return changes

    def nothing_more(self, wait_s: float = 3) -> bool:
        """Whether no further record arrives within ``wait_s``."""
        try:
            self.read(1, timeout_s=wait_s)
        except ConnectError:
            return True
        return False

    def decode(self, key: bytes | None, value: bytes | None) -> Change:
        key_id, decoded_key = self._decode_one(key)
        value_id, decoded_value = self._decode_one(value)
        return Change(key, value, decoded_key, decoded_value, (key_id, value_id))

    def _decode_one(self, raw: bytes | None) -> tuple[int | None, Any]:
        if raw is None:
            return None, None
        if self.serialization != "avro":
            return None, json.loads(raw)
        from fastavro import schemaless_reader

        from onceflow.decoding.schema_registry import MAGIC_BYTE, WIRE_HEADER

        magic, schema_id = WIRE_HEADER.unpack_from(raw)
        if magic != MAGIC_BYTE:
            raise ConnectError(f"{self.topic}: record starts with {magic}, not the wire format's magic byte")
        return schema_id, schemaless_reader(io.BytesIO(raw[WIRE_HEADER.size :]), self._schema(schema_id))

    def _schema(self, schema_id: int) -> Any:
        if schema_id not in self._schemas:
            from fastavro import parse_schema

            from onceflow.decoding.schema_registry import HttpSchemaRegistry

            if not self._registry_url:
                raise ConnectError("Avro records need ONCEFLOW_SCHEMA_REGISTRY_URL")
            text = HttpSchemaRegistry(self._registry_url, timeout_s=10).schema_by_id(schema_id)
            self.writer_schemas[schema_id] = text
            self._schemas[schema_id] = parse_schema(json.loads(text))
        return self._schemas[schema_id]

    def close(self) -> None:
        self._consumer.close()


def require_connect(settings: Settings) -> str:
    """The stack's Kafka Connect URL, checked to answer and to hold Debezium's PostgreSQL connector, with
    PostgreSQL ready for a new replication slot; fails the calling test in one line otherwise."""
    try:
        plugins = request("GET", "/connector-plugins")
    except (ConnectError, OSError) as exc:
        pytest.fail(f"Kafka Connect does not answer ({exc}); start it with `make services`", pytrace=False)
    classes = {plugin["class"] for plugin in plugins}
    assert "io.debezium.connector.postgresql.PostgresConnector" in classes, classes
    import psycopg

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute("SHOW wal_level").fetchone()
        in_doubt = [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts ORDER BY prepared")]
    if row is None or row[0] != "logical":
        pytest.fail(
            f"PostgreSQL runs with wal_level={row and row[0]}: restart it with `infra/postgres.sh restart`",
            pytrace=False,
        )
    if in_doubt:
        # A new logical replication slot waits until every transaction running in the server has ended,
        # prepared ones included: the connectors would hang in their first start.
        pytest.fail(
            f"{len(in_doubt)} prepared transaction(s) left in doubt in the stack's PostgreSQL "
            f"({', '.join(in_doubt[:3])}) block creating a replication slot: COMMIT PREPARED or "
            "ROLLBACK PREPARED them",
            pytrace=False,
        )
    remove_leftovers(settings.pg_dsn)
    return os.environ["ONCEFLOW_CONNECT_URL"]


@contextmanager
def source_table(pg_dsn: str, prefix: str, second_price: str) -> Iterator[str]:
    """A captured table ``(id, name, qty, price, updated_at)`` holding two rows (the second one's price
    given), with full old rows in the updates' and deletes' ``before``; dropped afterwards."""
    import psycopg

    table = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id integer PRIMARY KEY, name text NOT NULL, qty integer, "
            "price numeric(10, 2), updated_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        conn.execute(
            f"INSERT INTO {table} (id, name, qty, price) VALUES (1, 'ana', 3, 9.50), (2, 'ben', 1, %s)",
            [second_price],
        )
    try:
        yield table
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
