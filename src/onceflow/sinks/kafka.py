"""Transactional Kafka sink: records staged as durable files, published by the coordinator in one Kafka
transaction per slice together with the slice's input offsets.

Row format: ``{"key": bytes | str | None, "value": bytes | str}``; strings are encoded as UTF-8 and any
other column is an error. Staged records live in ``records.bin`` in the attempt's staging folder (see
`staging`), each record as ``key length (int32, -1 for no key), key, value length (int32), value``.
The staging root is a local folder, or an ``s3://bucket/prefix`` URL when the committer runs on another
host than the tasks (a Spark cluster): the tasks then stream their records into objects there, and the
committer reads them back from the bucket.

The committer's ``transactional.id`` is fixed per (pipeline, sink, slice): a restarted coordinator's
``init_transactions`` fences the previous one and aborts its open transaction. The slice's input offsets
are committed for the group ``onceflow-{pipeline}`` inside the same transaction, so the group position
is the marker that the slice is published: a retried commit that finds it at the epoch's until offsets
has nothing to do. A pipeline with two Kafka sinks must give them distinct ``group_id`` settings.
"""

from __future__ import annotations

import contextlib
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from onceflow.errors import ConfigError
from onceflow.faults import crash_point
from onceflow.names import check_name
from onceflow.sinks._config import ConfigReader, deployment_default
from onceflow.sinks._kafka_avro import AvroValues
from onceflow.sinks._kafka_batches import json_records, json_value, python_rows, raw_records
from onceflow.sinks._kafka_deadline import KafkaUnreachable, ProducerOwner, within
from onceflow.sinks.base import Committable, Row
from onceflow.sinks.errors import (
    RowError,
    SinkError,
    StagedOutputCorrupt,
    StagedOutputLost,
)
from onceflow.sinks.registry import SinkKind, SinkSetting
from onceflow.sinks.staging import StagedFileWriter, staging_area
from onceflow.sources.consumer_group import position_group
from onceflow.sources.kafka_clients import kafka_config
from onceflow.storage.s3 import S3Settings, is_s3

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Producer

    from onceflow.pipeline import Pipeline

KIND = "kafka"
RECORDS = "records.bin"
_LENGTH = struct.Struct(">i")
VALUE_FORMATS = ("raw", "json", "avro")

T = TypeVar("T")


@dataclass(frozen=True)
class KafkaSinkConfig:
    """``topic``, ``staging_root`` (folder or ``s3://bucket/prefix`` for staged records, with ``s3``
    the object store's settings, which `SinkKind.config_for` fills for an ``s3://`` root),
    ``bootstrap`` (the kind's defaults fill it with the deployment's Kafka), ``transaction_timeout_ms``
    (the producer's ``transaction.timeout.ms``, to compare with the pipeline's transaction timeout at plan
    time),
    ``partition`` (fixed output partition; default: by key hash), ``partitioner`` (librdkafka
    partitioner for keyed records, default ``murmur2_random`` as in Java clients), ``group_id`` (default
    ``onceflow-{pipeline}``), ``timeout_s`` (per broker operation), ``value_format`` ("raw": rows are
    exactly ``key`` and ``value``; "json": any row becomes a JSON object, keyed by the text of column
    ``key_column`` when given, nested values as objects and arrays (`_kafka_batches.json_value` says how
    timestamps, dates, decimals and bytes are written: as a nested JSON format reads them back); "avro":
    any row becomes an Avro record of ``subject``'s latest schema in the registry at
    ``schema_registry_url``, in the registry's wire format, structs and maps as records and maps, lists
    as arrays), ``name`` (the sink name, narrowing ``orphans``)."""

    topic: str
    staging_root: str
    bootstrap: str
    transaction_timeout_ms: int = 900_000
    partition: int | None = None
    partitioner: str = "murmur2_random"
    group_id: str | None = None
    timeout_s: int = 30
    value_format: str = "raw"
    key_column: str | None = None
    subject: str | None = None
    schema_registry_url: str | None = None
    schema_registry_allow_insecure_auth: bool = False
    name: str | None = None
    s3: S3Settings | None = None

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> KafkaSinkConfig:
        reader = ConfigReader(KIND, config)
        bootstrap = reader.optional_string("bootstrap")
        root = reader.path("staging_root", s3_url=True)
        store = reader.optional_mapping("s3")
        if is_s3(root) and store is None:  # the kind's config_for fills it for an s3:// root
            raise deployment_default(KIND, "s3", "Settings.s3 (the AWS_* variables)")
        parsed = cls(
            topic=reader.string("topic"),
            staging_root=root,
            bootstrap=bootstrap or "",
            transaction_timeout_ms=reader.integer("transaction_timeout_ms", 900_000, minimum=1000),
            partition=reader.optional_integer("partition"),
            partitioner=reader.string("partitioner", "murmur2_random"),
            group_id=reader.optional_string("group_id"),
            timeout_s=reader.integer("timeout_s", 30, minimum=1),
            value_format=reader.string("value_format", "raw"),
            key_column=reader.optional_string("key_column"),
            subject=reader.optional_string("subject"),
            schema_registry_url=reader.optional_string("schema_registry_url"),
            schema_registry_allow_insecure_auth=reader.boolean("schema_registry_allow_insecure_auth", False),
            name=reader.optional_string("name"),
            s3=None if store is None or not is_s3(root) else S3Settings.from_config(store, f"{KIND} sink"),
        )
        reader.finish()
        if bootstrap is None:  # the kind's defaults fill it with the deployment's Kafka
            raise deployment_default(KIND, "bootstrap", "Settings.kafka_bootstrap (ONCEFLOW_KAFKA_BOOTSTRAP)")
        if parsed.value_format not in VALUE_FORMATS:
            raise ConfigError(
                f"{KIND} sink config value_format={parsed.value_format!r}: expected {VALUE_FORMATS}"
            )
        if parsed.key_column is not None and parsed.value_format == "raw":
            raise ConfigError(f"{KIND} sink config key_column: only used with value_format 'json' or 'avro'")
        if parsed.subject is not None and parsed.value_format != "avro":
            raise ConfigError(f"{KIND} sink config subject: only used with value_format 'avro'")
        return parsed

    @property
    def value_subject(self) -> str:
        """The registry subject whose latest schema Avro values are written with."""
        return self.subject or f"{self.topic}-value"

    def group_for(self, pipeline: str) -> str:
        return self.group_id or group_id(pipeline)


def _as_config(config: KafkaSinkConfig | Mapping[str, Any]) -> KafkaSinkConfig:
    return config if isinstance(config, KafkaSinkConfig) else KafkaSinkConfig.from_mapping(config)


def transactional_id(pipeline: str, sink: str, slice_: int) -> str:
    """Fixed per (pipeline, sink, slice): the next coordinator fences a crashed one by reusing it.

    The parts are joined with ':', which `check_name` keeps out of names, so that no two (pipeline,
    sink) pairs share an id: joined with '-', which names may contain, pipeline ``a-b`` with sink ``c``
    and pipeline ``a`` with sink ``b-c`` fenced each other's transactions. Ids of the older form
    (``onceflow-<pipeline>-<sink>-s<slice>``) are never produced again (docs/operations.md says how to
    move a pipeline off them)."""
    return f"{transactional_id_prefix(pipeline)}{check_name('sink', sink)}:s{slice_}"


def transactional_id_prefix(pipeline: str) -> str:
    """What every transactional id of ``pipeline``'s Kafka sinks starts with, and no other pipeline's."""
    return f"onceflow:{check_name('pipeline', pipeline)}:"


def group_id(pipeline: str) -> str:
    """The default group: the one that shows the pipeline's position to Kafka's tools."""
    return position_group(pipeline)


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise RowError(f"{KIND} sink: {what} must be bytes or str, got {type(value).__name__}")


def json_record(row: Row, key_column: str | None) -> Row:
    """A row as a {key, value} record: its columns as a JSON object, keyed by one column's text."""
    if not isinstance(row, Mapping):
        raise RowError(f"{KIND} sink: a row must be a mapping, not {type(row).__name__}")
    if key_column is not None and key_column not in row:
        raise RowError(f"{KIND} sink: key_column {key_column!r} is not among the row's columns {sorted(row)}")
    key = None if key_column is None or row[key_column] is None else str(row[key_column])
    return {"key": key, "value": json_value(dict(row))}


def encode_record(row: Row) -> bytes:
    """One row as a length-prefixed record; rejects rows that are not exactly {key?, value}."""
    if not isinstance(row, Mapping):
        raise RowError(f"{KIND} sink: a row must be a mapping of 'key' and 'value', not {type(row).__name__}")
    unknown = sorted(set(row) - {"key", "value"})
    if unknown or "value" not in row:
        raise RowError(f"{KIND} sink: row columns must be 'value' and optional 'key', got {sorted(row)}")
    key = row.get("key")
    value = _as_bytes(row["value"], "value")
    if key is None:
        return _LENGTH.pack(-1) + _LENGTH.pack(len(value)) + value
    key_bytes = _as_bytes(key, "key")
    return _LENGTH.pack(len(key_bytes)) + key_bytes + _LENGTH.pack(len(value)) + value


def _read_exact(f: IO[bytes], size: int, path: object) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise StagedOutputCorrupt(f"{KIND}: {path} ends in the middle of a record")
    return data


def read_records(path: Path) -> Iterator[tuple[bytes | None, bytes]]:
    """The staged (key, value) records of one file, in the order they were written."""
    with open(path, "rb") as f:
        yield from records_in(f, path)


def records_in(f: IO[bytes], path: object) -> Iterator[tuple[bytes | None, bytes]]:
    """The staged (key, value) records read from ``f`` (a local file or an object's stream, which
    ``path`` names in errors), in the order they were written."""
    while head := f.read(_LENGTH.size):
        if len(head) != _LENGTH.size:
            raise StagedOutputCorrupt(f"{KIND}: {path} ends in the middle of a record")
        (key_len,) = _LENGTH.unpack(head)
        key = None if key_len < 0 else _read_exact(f, key_len, path)
        (value_len,) = _LENGTH.unpack(_read_exact(f, _LENGTH.size, path))
        yield key, _read_exact(f, value_len, path)


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key putting "s0-t2" before "s0-t10"."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def group_by_slice(committables: Sequence[Committable]) -> dict[int, list[Committable]]:
    """One epoch's committables per slice (ascending), each slice's tasks in task order."""
    groups: dict[int, list[Committable]] = {}
    for c in sorted(committables, key=lambda c: (c.slice, _natural(c.task))):
        groups.setdefault(c.slice, []).append(c)
    return groups


def slice_until_offsets(committables: Sequence[Committable]) -> dict[tuple[str, int], int]:
    """The position the slice's consumer group reaches: the max until offset per input partition."""
    until: dict[tuple[str, int], int] = {}
    for c in committables:
        for r in c.inputs:
            key = (r.topic, r.partition)
            until[key] = max(until.get(key, 0), r.until_offset)
    if not until:
        where = f"slice {committables[0].slice} of {committables[0].pipeline}" if committables else "a slice"
        raise SinkError(f"{KIND}: {where} has no input offsets, which the Kafka sink needs as its marker")
    return until


class KafkaWriter(StagedFileWriter):
    """Stages the task's records in a length-prefixed file; nothing reaches Kafka before commit."""

    kind = KIND
    file_name = RECORDS

    def __init__(self, config: KafkaSinkConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        super().__init__(staging_area(self.config.staging_root, self.config.s3))
        self._count = 0
        self._avro = (
            AvroValues(
                self.config.schema_registry_url,
                self.config.value_subject,
                self.config.key_column,
                f"{KIND} sink topic {self.config.topic}",
                self.config.schema_registry_allow_insecure_auth,
            )
            if self.config.value_format == "avro"
            else None
        )

    def write(self, rows: Iterable[Row]) -> None:
        out = self._out()
        as_json = self.config.value_format == "json"
        for row in rows:
            if self._avro is not None:
                out.write(encode_record(self._avro.record(row)))
            else:
                out.write(encode_record(json_record(row, self.config.key_column) if as_json else row))
            self._count += 1

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Stage an Arrow batch's records, encoded column-wise (see `_kafka_batches`) into the same
        bytes `write` stages for its rows."""
        if self._avro is not None:  # Avro encodes values one by one: through the rows (maps as dicts)
            self.write(python_rows(batch))
            return
        out = self._out()
        if self.config.value_format == "json":
            data = json_records(batch, self.config.key_column)
        else:
            data = raw_records(batch)
        out.write(memoryview(data))
        self._count += batch.num_rows

    def pre_commit(self) -> Committable:
        task, _ = self._seal()
        return self._publish(
            Committable.for_task(
                task,
                handle={"topic": self.config.topic, "file": RECORDS},
                record_count=self._count,
                checksum=self._sha256(),
            )
        )


class KafkaCommitter:
    """Publishes each slice in one Kafka transaction that also commits the slice's input offsets.

    ``crash_hook`` is called with a step name ("kafka.produced", "kafka.offsets_sent",
    "kafka.committed"); by default it is `onceflow.faults.crash_point`, inert unless a fault test arms it.
    """

    def __init__(
        self,
        config: KafkaSinkConfig | Mapping[str, Any],
        crash_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.config = _as_config(config)
        self._area = staging_area(self.config.staging_root, self.config.s3)
        self._hook = crash_hook or crash_point

    def commit(self, committables: Sequence[Committable]) -> None:
        """For each slice: 1. fence earlier producers of the slice (``init_transactions``), 2. if the
        group already stands at the until offsets the slice is published: skip, 3. otherwise produce the
        staged records, send the offsets and commit in one transaction, 4. delete the staging."""
        for group in group_by_slice(committables).values():
            self._commit_slice(group)
            for c in group:
                self._area.remove(self._area.for_committable(c))

    def _commit_slice(self, group: list[Committable]) -> None:
        from confluent_kafka import Producer

        first = group[0]
        until = slice_until_offsets(group)
        producer = Producer(
            kafka_config(
                self.config.bootstrap,
                {
                    "transactional.id": transactional_id(first.pipeline, first.sink, first.slice),
                    # What transactions imply anyway, said outright: on a replicated cluster a record
                    # counts as written once every in-sync replica has it (min.insync.replicas).
                    "acks": "all",
                    "transaction.timeout.ms": self.config.transaction_timeout_ms,
                    "partitioner": self.config.partitioner,
                },
            )
        )
        timeout = float(self.config.timeout_s)
        owner = ProducerOwner(producer, self.config.bootstrap, timeout)

        def bounded(what: str, call: Callable[[], T]) -> T:
            owner.hold()
            return within(what, self.config.bootstrap, timeout, call, done=owner.release)

        try:
            self._publish_slice(producer, group, until, bounded)
        finally:
            owner.release()

    def _publish_slice(
        self,
        producer: Producer,
        group: list[Committable],
        until: Mapping[tuple[str, int], int],
        bounded: Callable[[str, Callable[[], Any]], Any],
    ) -> None:
        from confluent_kafka import TopicPartition

        first = group[0]
        timeout = float(self.config.timeout_s)
        bounded("init_transactions", lambda: producer.init_transactions(timeout))
        if self._published(first.pipeline, until):
            return
        files = [self._staged_file(c) for c in group]
        producer.begin_transaction()
        try:
            for path in files:
                self._produce(producer, path)
            producer.flush(timeout)
            self._hook("kafka.produced")
            positions = [TopicPartition(t, p, offset) for (t, p), offset in sorted(until.items())]
            metadata = self._group_metadata(first.pipeline)
            bounded(
                "send_offsets_to_transaction",
                lambda: producer.send_offsets_to_transaction(positions, metadata, timeout),
            )
            self._hook("kafka.offsets_sent")
            bounded("commit_transaction", lambda: producer.commit_transaction(timeout))
        except BaseException:
            with contextlib.suppress(Exception):  # else the next init_transactions aborts it
                bounded("abort_transaction", lambda: producer.abort_transaction(timeout))
            raise
        self._hook("kafka.committed")

    def _staged_file(self, c: Committable) -> Any:
        """The attempt's staged records (a `Path`, or an ``s3://`` URL), checked against the checksum."""
        if c.handle.get("incomplete"):
            raise StagedOutputLost(f"{KIND}: {c.sink} epoch {c.epoch} {c.task} never pre-committed")
        path = self._area.file(self._area.for_committable(c), RECORDS)
        if not self._area.exists(path):
            raise StagedOutputLost(
                f"{KIND}: {path} is gone but the group {self.config.group_for(c.pipeline)} is not at the "
                f"epoch's offsets: epoch {c.epoch} slice {c.slice} was never published and cannot be"
            )
        if self._area.checksum(path) != c.checksum:
            raise StagedOutputCorrupt(f"{KIND}: {path} does not match its pre-commit checksum")
        return path

    def _produce(self, producer: Producer, path: Any) -> None:
        partition = -1 if self.config.partition is None else self.config.partition  # -1: the partitioner
        with self._area.open_input(path) as staged:
            self._produce_records(producer, records_in(staged, path), partition)

    def _produce_records(
        self, producer: Producer, records: Iterable[tuple[bytes | None, bytes]], partition: int
    ) -> None:
        for key, value in records:
            full_since = None
            while True:
                try:
                    producer.produce(self.config.topic, value=value, key=key, partition=partition)
                    break
                except BufferError:
                    full_since = full_since or time.monotonic()
                    if time.monotonic() - full_since > self.config.timeout_s:
                        raise KafkaUnreachable(
                            f"{KIND} sink: produce to {self.config.topic} got no delivery from "
                            f"{self.config.bootstrap} within {self.config.timeout_s} s (sink setting "
                            "timeout_s): the local queue stayed full; the slice is not published"
                        ) from None
                    producer.poll(0.5)  # the local queue is full: let deliveries drain it

    def _consumer_config(self, pipeline: str) -> dict[str, Any]:
        return kafka_config(
            self.config.bootstrap,
            {
                "group.id": self.config.group_for(pipeline),
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            },
        )

    def _group_metadata(self, pipeline: str) -> Any:
        from confluent_kafka import Consumer

        consumer = Consumer(self._consumer_config(pipeline))
        try:
            return consumer.consumer_group_metadata()
        finally:
            consumer.close()

    def committed_offsets(
        self, pipeline: str, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """The group's committed offsets (-1 where none), read with require-stable semantics."""
        from confluent_kafka import Consumer, TopicPartition

        wanted = [TopicPartition(t, p) for t, p in partitions]
        timeout = float(self.config.timeout_s)

        def read() -> Any:  # the consumer's whole life in the call: an abandoned one is not closed under it
            consumer = Consumer(self._consumer_config(pipeline))
            try:
                return consumer.committed(wanted, timeout)
            finally:
                consumer.close()

        found = within("reading the committed offsets", self.config.bootstrap, timeout, read)
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else -1 for tp in found}

    def _published(self, pipeline: str, until: Mapping[tuple[str, int], int]) -> bool:
        committed = self.committed_offsets(pipeline, until)
        return all(committed.get(tp, -1) >= offset for tp, offset in until.items())

    def abort(self, committables: Sequence[Committable]) -> None:
        """Nothing was published before commit, so abort only deletes the staging."""
        for c in committables:
            self._area.remove(self._area.for_committable(c))

    def orphans(self, pipeline: str) -> list[Committable]:
        return self._area.orphans(pipeline, self.config.name)


def check_transaction_timeout(config: KafkaSinkConfig, pipeline_timeout_ms: int) -> None:
    """Plan-time check: the broker must not abort a slice's transaction before the pipeline gives up."""
    if config.transaction_timeout_ms < pipeline_timeout_ms:
        raise ConfigError(
            f"{KIND} sink transaction_timeout_ms={config.transaction_timeout_ms} is shorter than the "
            f"pipeline's transaction timeout {pipeline_timeout_ms} ms"
        )


def _columns(config: Mapping[str, Any]) -> list[str] | None:
    """Raw records are exactly ``key`` and ``value``; JSON and Avro records take whatever the rows hold."""
    return None if config.get("value_format") in ("json", "avro") else ["key", "value"]


def _plan_checks(
    spec: Pipeline, configs: Sequence[Mapping[str, Any]], parallel_tasks: int, apply: bool = True
) -> None:
    """Refuse what would lose or drop data later.

    1. A producer ``transaction_timeout_ms`` shorter than the pipeline's transaction timeout: Kafka would
       abort a staged epoch that the pipeline may still commit, and the commit would find nothing.
    2. Two Kafka sinks committing input offsets to one consumer group: that position marks an epoch as
       published, so the second sink would take its epoch for published and drop it.
    """
    groups: dict[str, str] = {}
    for raw in configs:
        config, name = KafkaSinkConfig.from_mapping(raw), raw["name"]
        # 1.
        try:
            check_transaction_timeout(config, spec.transaction_timeout_s * 1000)
        except ConfigError as exc:
            raise ConfigError(
                f"sink {name!r}: {exc}; Kafka would abort a staged epoch that the pipeline may "
                "still commit. Raise transaction_timeout_ms (up to the broker's "
                "transaction.max.timeout.ms) or lower the pipeline's transaction_timeout_s"
            ) from exc
        # 2.
        group = config.group_for(spec.name)
        if group in groups:
            raise ConfigError(
                f"sinks {groups[group]!r} and {name!r} both commit input offsets to consumer group "
                f"{group!r}; that position marks an epoch as published, so each Kafka sink needs its own: "
                "set a distinct group_id in their configs"
            )
        groups[group] = name


SINK_KIND = SinkKind(
    name=KIND,
    consumer_group=lambda config, pipeline: _as_config(config).group_for(pipeline),
    writer=KafkaWriter,
    committer=KafkaCommitter,
    guarantee="exactly_once",
    columns=_columns,
    plan_checks=_plan_checks,
    defaults=lambda settings: {
        "bootstrap": settings.kafka_bootstrap,
        **(
            {}
            if settings.schema_registry_url is None
            else {"schema_registry_url": settings.schema_registry_url}
        ),
        **(
            {"schema_registry_allow_insecure_auth": True}
            if settings.schema_registry_allow_insecure_auth
            else {}
        ),
    },
    settings=(
        SinkSetting("topic", "string", "the output topic (create it first)", required=True),
        SinkSetting(
            "staging_root",
            "path",
            "folder where tasks stage records until the commit publishes them; an `s3://bucket/prefix` "
            "URL stages them as objects there, which a committer on another host reads (a Spark "
            "cluster), reached with the `AWS_*` settings (in Airflow: the `aws_default` connection)",
            required=True,
        ),
        SinkSetting(
            "bootstrap",
            "string",
            "bootstrap servers of the output cluster, `host:port[,host:port]`",
            default_from="`ONCEFLOW_KAFKA_BOOTSTRAP` (in Airflow: the `onceflow_kafka` connection)",
        ),
        SinkSetting(
            "transaction_timeout_ms",
            "integer",
            "the producer's `transaction.timeout.ms`; at least the pipeline's `transaction_timeout_s` "
            "(checked at plan time) and at most the broker's `transaction.max.timeout.ms`",
            default=900_000,
            minimum=1000,
        ),
        SinkSetting(
            "partition",
            "integer",
            "write every record to this partition",
            default_from="by the record key's hash",
        ),
        SinkSetting(
            "partitioner",
            "string",
            "librdkafka partitioner for keyed records (`murmur2_random` is the Java clients' choice)",
            default="murmur2_random",
        ),
        SinkSetting(
            "group_id",
            "string",
            "consumer group the input offsets are committed to in each output transaction; give each "
            "Kafka sink of a pipeline its own",
            default_from="`onceflow-<pipeline>`",
        ),
        SinkSetting(
            "timeout_s",
            "integer",
            "seconds per broker operation; a commit whose call gets no answer in this time fails (the epoch "
            "stays decided, and the next commit or recover publishes it)",
            default=30,
            minimum=1,
        ),
        SinkSetting(
            "value_format",
            "string",
            "`raw`: rows are exactly `key` and `value` (bytes or text); `json`: any row becomes a JSON "
            "object (structs and maps objects, arrays arrays; timestamps ISO-8601 text with an offset, "
            "dates ISO text, decimals numbers with their exact digits, bytes base64 text); `avro`: any row "
            "becomes an Avro record of `subject`'s latest schema (nested records, arrays and maps as it "
            "declares them), in the schema registry's wire format",
            default="raw",
            choices=VALUE_FORMATS,
        ),
        SinkSetting(
            "key_column",
            "string",
            "with `value_format: json` or `avro`, the column whose text becomes the record key",
            default_from="no key",
        ),
        SinkSetting(
            "subject",
            "string",
            "with `value_format: avro`, the registry subject whose latest schema the values are written "
            "with (register it first; the sink registers nothing)",
            default_from="`<topic>-value`",
        ),
        SinkSetting(
            "schema_registry_url",
            "string",
            "with `value_format: avro`, the schema registry (`http(s)://…` or `file:///folder`)",
            default_from="`ONCEFLOW_SCHEMA_REGISTRY_URL`",
        ),
        SinkSetting(
            "schema_registry_allow_insecure_auth",
            "boolean",
            "whether the registry URL's credentials may go over plain http, in clear text (else refused); "
            "`ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH=true` sets it for every Kafka sink",
            default=False,
        ),
    ),
)
