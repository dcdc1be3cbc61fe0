"""What the machine can do with the data set, beside which every pipeline of a throughput round is set.

Three figures, each over every record of the data set, in the same round as the pipelines:

- one Python consumer: one plain confluent-kafka consumer, assigned every partition from the start,
  drains them with ``consume()`` batches until each partition's end; no decoding and no output. The
  clock includes connecting and the first fetch. (A round stores it under ``limit``, as older reports
  did.)
- the JVM consumer: Kafka's own consumer performance tool (``kafka-consumer-perf-test``, i.e.
  ``org.apache.kafka.tools.ConsumerPerformance`` from the stack's Kafka jars, run as the script runs it)
  reads the topic from the start in a fresh group. Its time is the tool's own ``fetch.time.ms``: the
  wall time of fetching exactly the data set's records, without the JVM's start-up and the group join
  (``rebalance.time.ms``, stored beside it).
- native decode and write: the record values, read once into memory beforehand (not timed), in
  blocks of `BLOCK_RECORDS` records; for each block the clock runs over Arrow's C++ JSON reader
  (``pyarrow.json.read_json`` with the data set's schema), the bench's filter and projection
  (`bench.pipelines.filter_project`, in ``pyarrow.compute``) and the Parquet write of the kept rows to
  one temporary file, whose writer is opened and closed inside the clock too. Arrow's thread pool uses
  every core.

The machine's limit combines the last two: the records over the time of reading plus the time of
decoding and writing, on the same cores. No pipeline can read, decode, filter and write every record
faster on this machine with these tools; the pipelines are reported as a fraction of it, and of the
one Python consumer, which shows what a Python pipeline's reader alone can do.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.dataset import MIN_AMOUNT, PARTITIONS, PROJECTED, Dataset
from bench.dataset import kept as expected_rows

ROOT = Path(__file__).resolve().parents[1]
PERF_TOOL = "org.apache.kafka.tools.ConsumerPerformance"
# What kafka-consumer-perf-test passes to the JVM (its heap, and kafka-run-class's defaults).
JVM_OPTIONS = (
    "-Xmx512M",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
# Records per block of the native decode: 200 MB of values, so that 10^7 records never sit in memory
# at once beside their decoded table.
BLOCK_RECORDS = 1_000_000


@dataclass(frozen=True)
class ReadRate:
    records: int
    bytes: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    def to_dict(self) -> dict[str, float]:
        return {"records_per_s": self.records_per_s, "mb_per_s": self.mb_per_s, "seconds": self.seconds}


def _consumer(bootstrap: str, group: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )


def _batches(consumer: Any, data: Dataset) -> Iterator[list[Any]]:
    """Every record of the data set, in ``consume()`` batches, from each partition's start to its end."""
    from confluent_kafka import KafkaError, TopicPartition

    consumer.assign([TopicPartition(data.topic, p, 0) for p in range(PARTITIONS)])
    left = PARTITIONS
    while left:
        batch = []
        for message in consumer.consume(num_messages=10_000, timeout=1.0):
            error = message.error()
            if error is None:
                batch.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                left -= 1
            else:
                raise RuntimeError(f"reading {data.topic}: {error}")
        yield batch


def _check(what: str, records: int, data: Dataset) -> None:
    if records != data.records:
        raise RuntimeError(f"{what} read {records} records of {data.topic}, expected {data.records}")


def read_all(bootstrap: str, data: Dataset) -> ReadRate:
    """One Python consumer reads every record of the data set once."""
    started = time.perf_counter()
    consumer = _consumer(bootstrap, "onceflow-bench-limit")
    records, size = 0, 0
    try:
        for batch in _batches(consumer, data):
            records += len(batch)
            size += sum(len(message.value()) for message in batch)
    finally:
        consumer.close()
    _check("one Python consumer", records, data)
    return ReadRate(records, size, time.perf_counter() - started)


def kafka_libs() -> Path:
    """The Kafka jars the stack resolved (`infra/kafka.sh jars`), where infra/env.sh puts them."""
    cache = Path(os.environ.get("ONCEFLOW_CACHE") or ROOT / ".cache")
    return cache / f"kafka-{os.environ.get('ONCEFLOW_KAFKA_VERSION', '4.1.1')}" / "libs"


def parse_perf_line(header: str, line: str) -> dict[str, float]:
    """ConsumerPerformance's summary (a header and a line of comma-separated fields) as numbers by
    field name; its two date fields are left out."""
    names = [name.strip() for name in header.split(",")]
    values = [value.strip() for value in line.split(",")]
    if len(names) != len(values) or "fetch.time.ms" not in names:
        raise ValueError(f"not a ConsumerPerformance summary: {header!r} / {line!r}")
    return {
        n: float(v)
        for n, v in zip(names, values, strict=True)
        if not n.endswith(".time") or n == "fetch.time.ms"
    }


def jvm_read(bootstrap: str, data: Dataset) -> tuple[ReadRate, dict[str, float]]:
    """Kafka's JVM consumer reads every record of the data set once, in a fresh group from the start:
    its fetch time over the data set's value bytes, and the tool's own summary fields."""
    with tempfile.NamedTemporaryFile("w", suffix=".properties") as config:
        config.write("isolation.level=read_committed\n")  # as the Python consumer reads
        config.flush()
        command = [
            "java",
            *JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={ROOT / 'infra/kafka/log4j2-tools.yaml'}",
            "-cp",
            f"{kafka_libs()}/*",
            PERF_TOOL,
            "--bootstrap-server",
            bootstrap,
            "--topic",
            data.topic,
            "--messages",
            str(data.records),
            "--group",
            f"onceflow-bench-jvm-{time.time_ns()}",
            "--consumer.config",
            config.name,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{PERF_TOOL} exited {done.returncode}: {done.stderr[-1000:]}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    header = next(n for n, line in enumerate(lines) if line.startswith("start.time"))
    fields = parse_perf_line(lines[header], lines[header + 1])
    _check("the JVM consumer", int(fields["data.consumed.in.nMsg"]), data)
    return ReadRate(data.records, data.bytes, fields["fetch.time.ms"] / 1000), fields


def value_blocks(bootstrap: str, data: Dataset, block: int = BLOCK_RECORDS) -> Iterator[tuple[int, bytes]]:
    """The data set's values as JSON lines, ``block`` records at a time: (records, bytes)."""
    consumer = _consumer(bootstrap, "onceflow-bench-native")
    values: list[bytes] = []
    records = 0
    try:
        for batch in _batches(consumer, data):
            values += [message.value() for message in batch]
            if len(values) >= block:
                records += len(values)
                yield len(values), b"\n".join(values) + b"\n"
                values = []
        if values:
            records += len(values)
            yield len(values), b"\n".join(values) + b"\n"
    finally:
        consumer.close()
    _check("the value reader", records, data)


def decode_write(bootstrap: str, data: Dataset, workdir: Path) -> tuple[ReadRate, int]:
    """Arrow decodes, filters, projects and writes every record of the data set to Parquet: the time
    of that alone (the values are read beforehand, a block at a time), and the rows kept."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("amount", pa.float64()),
            ("customer", pa.string()),
            ("country", pa.string()),
            ("note", pa.string()),
        ]
    )
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    seconds, size, kept = 0.0, 0, 0
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="native-") as folder:
        path = Path(folder) / "out.parquet"
        writer = None
        try:
            for records, values in value_blocks(bootstrap, data):
                size += len(values) - records  # the values alone, as the consumers count them
                started = time.perf_counter()
                table = pj.read_json(pa.BufferReader(values), parse_options=parse)
                rows = table.filter(pc.greater_equal(table["amount"], MIN_AMOUNT)).select(list(PROJECTED))
                if writer is None:
                    writer = pq.ParquetWriter(path, rows.schema)
                writer.write_table(rows)
                kept += rows.num_rows
                seconds += time.perf_counter() - started
        finally:
            if writer is not None:
                started = time.perf_counter()
                writer.close()
                seconds += time.perf_counter() - started
        written = pq.read_metadata(path).num_rows
    if not kept == written == expected_rows(data.records):
        raise RuntimeError(f"kept {kept} rows and wrote {written}, expected {expected_rows(data.records)}")
    return ReadRate(data.records, size, seconds), kept


def measure(bootstrap: str, data: Dataset, workdir: Path) -> dict[str, Any]:
    """A round's three figures and the machine's limit, under their keys of the round's entry."""
    python = read_all(bootstrap, data)
    jvm, fields = jvm_read(bootstrap, data)
    native, kept = decode_write(bootstrap, data, workdir)
    machine = ReadRate(data.records, data.bytes, jvm.seconds + native.seconds)
    return {
        "limit": python.to_dict(),
        "jvm_consumer": jvm.to_dict() | {"tool": fields},
        "native_decode_write": native.to_dict() | {"kept": kept},
        "machine_limit": machine.to_dict() | {"read_s": jvm.seconds, "decode_write_s": native.seconds},
    }
