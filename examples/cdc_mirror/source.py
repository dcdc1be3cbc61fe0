"""The source side of the CDC mirror example, step by step as README runs it:

    python -m examples.cdc_mirror.source start       # the table customers, and Debezium capturing it
    python -m examples.cdc_mirror.source change      # a round of inserts, updates and deletes
    python -m examples.cdc_mirror.source add-column  # ALTER TABLE customers ADD COLUMN tier, and uses it
    python -m examples.cdc_mirror.source compare     # the source, the replica and the lake, row for row
    python -m examples.cdc_mirror.source stop        # the connector, its slot and publication removed

It talks to the deployment's PostgreSQL (``ONCEFLOW_PG_DSN``) and to Kafka Connect's REST API
(``ONCEFLOW_CONNECT_URL``), both as `make services` prints them. Each ``change`` writes its changes in a
few transactions, each over several rows, so that the pipeline's cut between source transactions has
something to do.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from examples.cdc_mirror import pipeline as names
from onceflow.config import Settings

CONNECTOR = names.TOPIC_PREFIX
SLOT = PUBLICATION = f"onceflow_{names.SOURCE_TABLE}"
COLUMNS = ("id", "name", "email", "balance", "updated_at")


def _connect(path: str, method: str = "GET", body: Any = None) -> Any:
    url = os.environ.get("ONCEFLOW_CONNECT_URL", "http://127.0.0.1:18083").rstrip("/")
    request = urllib.request.Request(
        url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
    except urllib.error.HTTPError as exc:
        raise SystemExit(
            f"Kafka Connect: {method} {path}: HTTP {exc.code} {exc.read().decode()[:500]}"
        ) from exc
    except OSError as exc:
        raise SystemExit(
            f"Kafka Connect at {url} does not answer ({exc}); start it with `make services`"
        ) from exc
    return json.loads(text) if text.strip() else None


def topic_end(bootstrap: str, topic: str = names.TOPIC) -> int:
    """How many offsets the change topic (one partition) holds; 0 before Debezium created it."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cdc-mirror-example"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1])
    except KafkaException:
        return 0
    finally:
        consumer.close()


def wait_written(bootstrap: str, end: int, timeout_s: float = 120) -> None:
    """Until Debezium has written the change topic up to ``end``, so that the next epoch has them all."""
    deadline = time.monotonic() + timeout_s
    while (now := topic_end(bootstrap)) < end:
        if time.monotonic() > deadline:
            raise SystemExit(f"{names.TOPIC} holds {now} records after {timeout_s:.0f} s, {end} expected")
        time.sleep(0.3)


def connector_config(
    dsn: str, *, prefix: str, tables: list[str], slot: str, publication: str, transactions: bool
) -> dict[str, str]:
    """Debezium's PostgreSQL connector capturing ``tables`` (``schema.table``) through pgoutput, with its
    own slot and an existing publication, from the tables' current rows on (an initial snapshot), topics
    ``<prefix>.<schema>.<table>`` of one partition each; converters are the caller's."""
    params = conninfo_to_dict(dsn)
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": str(params.get("host", "127.0.0.1")),
        "database.port": str(params.get("port", 5432)),
        "database.user": str(params["user"]),
        "database.password": str(params.get("password", "")),
        "database.dbname": str(params["dbname"]),
        "topic.prefix": prefix,
        "table.include.list": ",".join(tables),
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "initial",
        "provide.transaction.metadata": "true" if transactions else "false",
        # The brokers create no topics on their own: the worker creates each one on its first record.
        "topic.creation.default.replication.factor": "-1",
        "topic.creation.default.partitions": "1",
    }


def start(dsn: str) -> int:
    """Create and fill the source table, its publication, and register the connector (initial snapshot,
    then the stream), then wait until it runs. Returns how many rows the table holds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {names.SOURCE_TABLE} (id int PRIMARY KEY, name text NOT NULL, "
            "email text, balance numeric(12,2), updated_at timestamptz NOT NULL DEFAULT now())"
        )
        # Deletes and updates carry the whole old row, so every change names every column.
        conn.execute(f"ALTER TABLE {names.SOURCE_TABLE} REPLICA IDENTITY FULL")
        conn.execute(
            f"INSERT INTO {names.SOURCE_TABLE} (id, name, email, balance) "
            "SELECT i, 'customer ' || i, 'c' || i || '@example.com', i * 10.5 FROM generate_series(1, 20) i "
            "ON CONFLICT (id) DO NOTHING"
        )
        if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)).fetchone():
            conn.execute(f'CREATE PUBLICATION "{PUBLICATION}" FOR TABLE {names.SOURCE_TABLE}')
    config = {
        **connector_config(
            dsn,
            prefix=names.TOPIC_PREFIX,
            tables=[f"public.{names.SOURCE_TABLE}"],
            slot=SLOT,
            publication=PUBLICATION,
            transactions=True,
        ),
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    }
    _connect(f"/connectors/{CONNECTOR}/config", "PUT", config)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            status = _connect(f"/connectors/{CONNECTOR}/status")
        except SystemExit:
            status = {}
        states = [status.get("connector", {}).get("state")] + [t["state"] for t in status.get("tasks", [])]
        if "FAILED" in states:
            raise SystemExit(f"connector {CONNECTOR} failed: {json.dumps(status)[:1000]}")
        if status.get("tasks") and set(states) == {"RUNNING"}:
            print(f"connector {CONNECTOR} runs: {names.SOURCE_TABLE} -> {names.TOPIC}, {names.TRANSACTIONS}")
            return len(source_rows(dsn, with_tier=has_tier(dsn)))
        time.sleep(0.5)
    raise SystemExit(f"connector {CONNECTOR} does not run after 120 s")


def change(dsn: str, round_number: int = 1) -> int:
    """One round of changes in three transactions: new customers, updates (one key several times), and
    deletes (one of them of a customer inserted in the same round). Returns how many records Debezium
    writes for them (a delete is followed by its tombstone)."""
    base = 100 * round_number
    with psycopg.connect(dsn) as conn:
        for i in range(base, base + 5):
            conn.execute(
                f"INSERT INTO {names.SOURCE_TABLE} (id, name, email, balance) VALUES (%s, %s, %s, %s)",
                (i, f"customer {i}", None if i % 2 else f"c{i}@example.com", Decimal(i) / 4),
            )
        conn.commit()
        for step in range(3):
            conn.execute(
                f"UPDATE {names.SOURCE_TABLE} SET balance = balance + 1.25, updated_at = now() WHERE id = 1"
            )
            conn.execute(
                f"UPDATE {names.SOURCE_TABLE} SET name = name || ' *', updated_at = now() WHERE id = %s",
                (base + step,),
            )
        conn.commit()
        conn.execute(f"DELETE FROM {names.SOURCE_TABLE} WHERE id IN (%s, %s)", (2 + round_number, base + 4))
        conn.commit()
    print(f"round {round_number}: 5 inserts, 6 updates, 2 deletes in 3 transactions")
    return 5 + 6 + 2 * 2


def add_column(dsn: str) -> int:
    """The source table gets a column; some rows get a value in it. Returns how many records Debezium
    writes for it (one per updated row: a column added is no change event)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(f"ALTER TABLE {names.SOURCE_TABLE} ADD COLUMN IF NOT EXISTS tier text")
        updated = conn.execute(
            f"UPDATE {names.SOURCE_TABLE} SET tier = 'gold', updated_at = now() WHERE id % 3 = 0"
        ).rowcount
        conn.commit()
    print(f"{names.SOURCE_TABLE} has a column tier; {updated} customers (every third) are gold")
    return updated


def source_rows(dsn: str, with_tier: bool) -> dict[int, tuple[Any, ...]]:
    columns = [*COLUMNS, *(("tier",) if with_tier else ())]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM {names.SOURCE_TABLE}").fetchall()
    return {r[0]: tuple(r) for r in rows}


def replica_rows(dsn: str, with_tier: bool) -> dict[int, tuple[Any, ...]]:
    columns = [*COLUMNS, *(("tier",) if with_tier else ())]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM {names.REPLICA_TABLE}").fetchall()
    return {r[0]: tuple(r) for r in rows}


def lake_rows(settings: Settings, with_tier: bool) -> dict[int, tuple[Any, ...]]:
    from onceflow.sinks.iceberg import IcebergConfig, default_catalog_properties, tables

    config = IcebergConfig.from_mapping(
        {"table": names.LAKE_TABLE, "catalog_properties": default_catalog_properties(settings.home)}
    )
    table = tables.load(config.open_catalog(), names.LAKE_TABLE)
    columns = [*COLUMNS, *(("tier",) if with_tier else ())]
    rows = [] if table is None else table.scan(selected_fields=tuple(columns)).to_arrow().to_pylist()
    return {r["id"]: tuple(r[c] for c in columns) for r in rows}


def compare(settings: Settings, with_tier: bool) -> list[str]:
    """The differences between the source and each mirror (none: an empty list)."""
    source = source_rows(settings.pg_dsn, with_tier)
    problems = []
    try:
        replica = replica_rows(settings.pg_dsn, with_tier)
    except psycopg.errors.UndefinedTable:
        replica = {}
    for name, mirror in (("replica", replica), ("lake", lake_rows(settings, with_tier))):
        missing = sorted(source.keys() - mirror.keys())
        extra = sorted(mirror.keys() - source.keys())
        differ = sorted(k for k in source.keys() & mirror.keys() if source[k] != mirror[k])
        if missing or extra or differ:
            problems.append(f"{name}: missing ids {missing}, extra ids {extra}, differing ids {differ}")
    return problems


def stop(dsn: str) -> None:
    try:
        _connect(f"/connectors/{CONNECTOR}", "DELETE")
    except SystemExit as exc:
        if "404" not in str(exc):
            raise
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
            ).fetchone()
            if row is None:
                break
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
                break
            time.sleep(0.5)
        conn.execute(f'DROP PUBLICATION IF EXISTS "{PUBLICATION}"')
    print(f"connector {CONNECTOR}, slot {SLOT} and publication {PUBLICATION} removed")


def has_tier(dsn: str) -> bool:
    """Whether the source table has the column ``add-column`` adds."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'tier'",
            (names.SOURCE_TABLE,),
        ).fetchone()
    return found is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.cdc_mirror.source", description=__doc__)
    parser.add_argument("step", choices=("start", "change", "add-column", "compare", "stop"))
    parser.add_argument("--round", type=int, default=1, help="change: which round (ids 100*round on)")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    dsn, bootstrap = settings.pg_dsn, settings.kafka_bootstrap
    if args.step == "stop":
        stop(dsn)
        return 0
    if args.step == "compare":
        problems = compare(settings, has_tier(dsn))
        for line in problems:
            print(line)
        if not problems:
            print(f"the replica and the lake equal {names.SOURCE_TABLE}, row for row")
        return 1 if problems else 0
    before = topic_end(bootstrap)
    if args.step == "start":
        wait_written(bootstrap, max(before, start(dsn)))  # a new connector's snapshot: a record per row
    elif args.step == "change":
        wait_written(bootstrap, before + change(dsn, args.round))
    else:
        wait_written(bootstrap, before + add_column(dsn))
    print(f"Debezium wrote them to {names.TOPIC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
