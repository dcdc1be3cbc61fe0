"""`python -m bench.run` (and `make bench`): every benchmark, then bench/report.md, report.json, report.png.

Steps:
1. spark-submit start-up, with a job that does nothing;
2. the fixed cost of an epoch by step, with an SQLite and a PostgreSQL ledger (small epochs);
2b. the latency of an epoch of 1,000 records, plan to commit, on the warm Spark runtime and through
   spark-submit, side by side, and what the warm runtime holds in memory while idle;
3. commit time against epoch size for each two-phase sink (no Spark);
4. per data-set size, ``--runs`` rounds of: what the machine can do with the records (`bench.limit`: one
   Python consumer's read rate, Kafka's JVM consumer's, Arrow's native decode and Parquet write, and
   the machine's limit, those two together), onceflow exactly-once to Parquet files, exactly-once to
   PostgreSQL (2PC), at-least-once to PostgreSQL (plain), Spark Structured Streaming and quix-streams;
   every ratio is taken within a round, then the median (``--steps limit``: the machine's figures
   alone, no Spark);
4b. Avro beside JSON (``--steps avro``): the same records as Avro in the registry wire format, per round
   the files pipeline on the JSON and on the Avro topic, Structured Streaming with from_json and with
   from_avro;
4c. nested JSON beside flat JSON (``--steps nested``): orders with five items, per round the files
   pipeline on the flat topic and on the nested one (each read path; the JVM one at
   ``--nested-jvm-sizes``), Structured Streaming with the flat and the nested StructType;
4d. nested Avro (``--steps nested_avro``): the same orders as Avro in the registry wire format, per
   round the files pipeline and Structured Streaming with from_avro and the nested schema;
4e. the Delta sink (``--steps delta``): per round, in alternating order, the pipeline into Parquet files,
   into Iceberg and into Delta, and Structured Streaming's Delta sink, on the same topic; then the Delta
   commit time against epoch size (unless step 3 runs, which measures it with the other sinks);
4f. object storage (``--steps s3``): per round, in alternating order, on the same topic, the pipeline into
   Parquet files on the local disk and in the stack's bucket, into Iceberg with its warehouse on the
   local disk and in the bucket, and Structured Streaming's Parquet file sink into the bucket through
   Hadoop's S3A connector; then the files commit in the bucket against epoch size;
5. peak memory of epochs of a fixed batch on the largest data set;
5b. the warm runtime's memory over many distinct pipelines and epochs (``--steps runtime_memory``);
6. the report.

Pipelines run on the warm Spark runtime when ``ONCEFLOW_SPARK_REMOTE`` is set (``make services`` sets
it), through spark-submit otherwise; the report says which. Needs the stack's services
(``eval "$(make -s services)"``). Writes only under ``--workdir`` (deleted
afterwards), to uniquely named topics, tables and databases (dropped afterwards), and to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from bench import commit_cost, report
from bench.dataset import (
    NESTED_RECORD_BYTES,
    PARTITIONS,
    RECORD_BYTES,
    Dataset,
    create_topic,
    delete_topics,
    kept,
    produce,
)
from bench.epochs import PipelineRun, run_to_end, runtime_pids
from bench.ledgers import postgres_ledger, sqlite_ledger
from bench.limit import measure as machine_figures
from bench.pipelines import NESTED_TRANSFORM, bench_pipeline
from onceflow import redact
from onceflow.config import Settings
from onceflow.pipeline import AvroFormat, JsonFormat, RecordFormat

HERE = Path(__file__).resolve().parent
DEFAULT_SIZES = (100_000, 1_000_000)
FULL_SIZES = (100_000, 1_000_000, 10_000_000)
COMMIT_SIZES = (10_000, 100_000, 1_000_000)
BATCH_PER_PARTITION = 250_000  # 10^6 records per epoch over 4 partitions
MEMORY_BATCH_PER_PARTITION = 25_000  # 10^5 records per epoch
PIPELINE_CONFIGS = ("files", "postgres_2pc", "plain")


def say(message: str) -> None:
    print(f"[onceflow bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _runtime_shape() -> str:
    """How the local warm runtime runs its tasks, as the report shows it beside the remote."""
    from local_stack.spark_runtime import SparkRuntime

    return "; lean: one JVM, the tasks in the Connect server" if SparkRuntime.from_env().lean else ""


class Bench:
    def __init__(self, settings: Settings, workdir: Path, runs: int) -> None:
        self.settings = settings
        self.workdir = workdir
        self.runs = runs
        self.results: dict[str, Any] = {}
        self.merge_into: dict[str, Any] | None = None  # --merge: earlier results that new ones update
        self.remote = settings.spark_remote  # the warm runtime's Spark Connect server, or None: spark-submit
        self.runtime = (
            f"Spark Connect ({redact.url(self.remote)}{_runtime_shape()})"
            if self.remote
            else "spark-submit, one per slice"
        )

    def warm(self, step: str) -> Settings | None:
        """The settings with the warm runtime's remote, for a step that needs it; None (and a line saying
        the step is skipped) without one."""
        if self.remote is None:
            say(f"{step}: no warm runtime (ONCEFLOW_SPARK_REMOTE is not set); skipped")
            return None
        return dataclasses.replace(self.settings, spark_remote=self.remote)

    def record(self, key: str, value: Any) -> None:
        """Store a step's results, updating size by size what is already under ``key``: the earlier
        run's with --merge, or an earlier step's of this run (the delta step adds the Delta commit to
        step 3's sinks)."""
        previous = self.results.get(key)
        self.results[key] = _deep_merge(previous, value) if isinstance(previous, dict) else value

    # 1.
    def spark_startup(self) -> None:
        from bench.spark_startup import spark_startup_s

        self.record("spark_startup_s", [spark_startup_s(self.settings) for _ in range(self.runs)])
        say(f"spark-submit start-up: {self.results['spark_startup_s']}")

    # 2.
    def epoch_overhead(self) -> None:
        per_epoch = 1000
        data = produce(self.settings.kafka_bootstrap, per_epoch * self.runs, "bench-overhead")
        out: dict[str, Any] = {}
        try:
            for backend, ledger in (
                ("sqlite", lambda: sqlite_ledger(self.workdir)),
                ("postgresql", lambda: postgres_ledger(self.settings.pg_dsn)),
            ):
                with ledger() as url:
                    settings = dataclasses.replace(self.settings, ledger_url=url)
                    run = self._pipeline("files", data, settings, per_epoch // PARTITIONS)
                out[backend] = run.to_dict()["epochs"]
                say(f"epoch overhead with the {backend} ledger: {len(run.epochs)} epochs")
        finally:
            delete_topics(self.settings.kafka_bootstrap, [data.topic])
        self.record("overhead", {"records_per_epoch": per_epoch, "ledgers": out})

    # 2b.
    def latency(self, epochs: int = 10) -> None:
        """Epochs of 1,000 records into Parquet files, plan to commit, on each runtime in turn; then
        the warm runtime's resident memory with no epoch running."""
        from bench.memory import MEASURE, TreeSampler

        if self.warm("latency") is None:
            return
        per_epoch = 1000
        out: dict[str, Any] = {
            "records_per_epoch": per_epoch,
            "remote": self.remote and redact.url(self.remote),
        }
        for runtime, remote in (("connect", self.remote), ("submit", None)):
            data = produce(self.settings.kafka_bootstrap, per_epoch * epochs, f"bench-latency-{runtime}")
            try:
                run = self._pipeline("files", data, self.settings, per_epoch // PARTITIONS, remote=remote)
            finally:
                delete_topics(self.settings.kafka_bootstrap, [data.topic])
            out[runtime] = run.to_dict()["epochs"]
            say(f"latency on {runtime}: {[round(e.total_s, 2) for e in run.epochs]}")
        time.sleep(5)  # let the last epoch's tasks end before sampling the idle runtime
        idle = TreeSampler(os.getpid(), runtime_pids()).start()
        time.sleep(3)
        out["idle_runtime"] = {**dataclasses.asdict(idle.stop()), "memory_measure": MEASURE}
        self.record("latency", out)

    # 2c.
    def follow(self) -> None:
        """Freshness through one long-lived follower (`onceflow run --follow`) on the warm runtime."""
        from bench import follow_latency

        settings = self.warm("follow")
        if settings is None:
            return
        out = follow_latency.measure(settings, self.workdir)
        say(f"follow: freshness median {out['freshness_median_s']} s, epoch median {out['epoch_median_s']} s")
        self.record("follow", out)

    def airflow_route(self) -> None:
        """Epochs through a real Airflow scheduler (api-server, scheduler, DAG processor) on the warm
        runtime: DAG run queued → committed, and where each task's time goes."""
        from bench import airflow_route

        settings = self.warm("airflow")
        if settings is None:
            return
        out = airflow_route.measure(settings, self.workdir)
        say(f"airflow: queued → committed median {out['queued_to_committed_median_s']} s")
        self.record("airflow_route", out)

    def spark_jobs(self, sizes: tuple[int, ...]) -> None:
        """What one epoch of the files pipeline costs Spark itself (jobs, stages, shuffle bytes), from the
        Connect server's REST API, at each size."""
        from bench import spark_jobs

        if self.warm("jobs") is None:
            return
        out: dict[str, list[dict[str, Any]]] = {}
        for size in sizes:
            out[str(size)] = [spark_jobs.measure(size, spark_jobs.default_ui()) for _ in range(self.runs)]
            say(f"jobs {size} records: {out[str(size)]}")
        self.record("spark_jobs", out)

    # 3.
    def commit_cost(self, sizes: tuple[int, ...], kinds: tuple[str, ...] = commit_cost.SINK_KINDS) -> None:
        topic = create_topic(self.settings.kafka_bootstrap, "bench-commit")
        out: dict[str, dict[str, list[float]]] = {}
        try:
            for kind in kinds:
                for rows in sizes:
                    seconds = [
                        commit_cost.commit_seconds(kind, rows, self.workdir, self.settings, topic)
                        for _ in range(self.runs)
                    ]
                    out.setdefault(kind, {})[str(rows)] = seconds
                    say(f"commit {kind} {rows} rows: {[round(s, 3) for s in seconds]}")
        finally:
            delete_topics(self.settings.kafka_bootstrap, [topic])
        self.record("commit_cost", out)

    # 3b.
    def sink_protocol(self, sizes: tuple[int, ...]) -> None:
        """Exactly-once against at-least-once in the sink alone, without Spark's noise: per round, the
        same rows written, pre-committed and committed through ``plain`` and then ``postgres_2pc``."""
        topic = create_topic(self.settings.kafka_bootstrap, "bench-protocol")
        out: dict[str, list[dict[str, float]]] = {}
        try:
            for rows in sizes:
                rounds = []
                for _ in range(self.runs):
                    entry: dict[str, float] = {}
                    for kind in ("plain", "postgres_2pc"):
                        stage_s, commit_s = commit_cost.stage_and_commit_seconds(
                            kind, rows, self.workdir, self.settings, topic
                        )
                        entry[f"{kind}_s"] = stage_s + commit_s
                    rounds.append(entry)
                out[str(rows)] = rounds
                say(f"sink protocol {rows} rows: {rounds}")
        finally:
            delete_topics(self.settings.kafka_bootstrap, [topic])
        self.record("sink_protocol", out)

    # 4.
    def throughput(
        self, sizes: tuple[int, ...], pg_sizes: tuple[int, ...], peer_sizes: tuple[int, ...]
    ) -> None:
        """``pg_sizes``: the sizes at which the PostgreSQL pair (exactly-once 2PC, at-least-once plain)
        runs too, ``peer_sizes`` those at which the peers do; the files pipeline runs at every size."""
        from bench.peers import runs as peer_runs

        out: dict[str, Any] = {}
        for size in sizes:
            data = produce(self.settings.kafka_bootstrap, size)
            say(f"data set: {size} records in {data.topic} (produced in {data.produce_s:.1f}s)")
            rounds = []
            try:
                for n in range(self.runs):
                    entry: dict[str, Any] = {"load_before": load_average(), "runtime": self.runtime}
                    entry |= machine_figures(self.settings.kafka_bootstrap, data, self.workdir)
                    for config in PIPELINE_CONFIGS:
                        if config != "files" and size not in pg_sizes:
                            continue
                        run = self._pipeline(config, data, self.settings, BATCH_PER_PARTITION)
                        entry[config] = run.to_dict()
                    if size in peer_sizes:
                        entry["spark_structured_streaming"] = self._structured_streaming(data)
                        quix = peer_runs.quix(self.settings, data)
                        entry["quix_streams"] = dataclasses.asdict(quix) | {
                            "records_per_s": quix.records_per_s
                        }
                    entry["load_after"] = load_average()
                    rounds.append(entry)
                    say(f"{size} records, round {n + 1}: " + _round_summary(entry))
            finally:
                delete_topics(self.settings.kafka_bootstrap, [data.topic])
            out[str(size)] = rounds
        self.record("throughput", out)

    # 4b.
    def avro(self, sizes: tuple[int, ...], peer_sizes: tuple[int, ...]) -> None:
        """Avro beside JSON on the same records: per round, the files pipeline on the JSON data set and on
        the Avro one, then Structured Streaming on each (``from_json``, ``from_avro``) at ``peer_sizes``;
        the ratios are taken within each round, as in step 4."""
        from bench.avro_topic import produce_avro

        out: dict[str, Any] = {}
        for size in sizes:
            with self._topics() as topics:
                data = produce(self.settings.kafka_bootstrap, size)
                topics.append(data.topic)
                avro = produce_avro(self.settings, size, self.workdir)
                topics.append(avro.data.topic)
                say(
                    f"data sets: {size} records as JSON in {data.topic} ({data.produce_s:.1f}s), as Avro "
                    f"in {avro.data.topic} ({avro.data.produce_s:.1f}s, {avro.value_bytes:.1f} bytes a "
                    f"value, schema id {avro.schema_id} in {avro.registry})"
                )
                systems = {
                    "files": partial(self._files, data, self.settings),
                    "files_avro": partial(self._files, avro.data, avro.settings, avro.fmt),
                }
                if size in peer_sizes:
                    systems["spark_structured_streaming"] = partial(self._structured_streaming, data)
                    systems["spark_structured_streaming_avro"] = partial(
                        self._structured_streaming, avro.data, avro.fmt.reader_schema
                    )
                rounds = self._rounds(f"avro {size} records", systems, report.avro_summary)
            out[str(size)] = {
                "json_value_bytes": RECORD_BYTES,
                "avro_value_bytes": avro.value_bytes,
                "registry": avro.registry,
                "rounds": rounds,
            }
        self.record("avro", out)

    # 4c.
    def nested(self, sizes: tuple[int, ...], peer_sizes: tuple[int, ...], jvm_sizes: tuple[int, ...]) -> None:
        """Nested JSON beside flat JSON: per round, the files pipeline on the flat data set, on the nested
        one (orders with NESTED_ITEMS items, NESTED_RECORD_BYTES bytes; the items written as they
        came) with the Python read path and, at ``jvm_sizes``, the JVM one, then Structured Streaming on
        each (``from_json`` with the flat or the nested ``StructType``) at ``peer_sizes``; ratios within
        each round."""
        from bench.dataset import NESTED_SCHEMA, nested_record

        fmt = JsonFormat(schema=NESTED_SCHEMA)
        jvm = dataclasses.replace(self.settings, json_read="jvm")
        out: dict[str, Any] = {}
        for size in sizes:
            with self._topics() as topics:
                flat = produce(self.settings.kafka_bootstrap, size)
                topics.append(flat.topic)
                nested = produce(
                    self.settings.kafka_bootstrap, size, prefix="bench-nested", value=nested_record
                )
                topics.append(nested.topic)
                say(f"data sets: {size} records as flat JSON and as nested JSON in {nested.topic}")
                systems = {
                    "files": partial(self._files, flat, self.settings),
                    "files_nested": partial(self._files, nested, self.settings, fmt, NESTED_TRANSFORM),
                }
                if size in jvm_sizes:
                    systems["files_nested_jvm"] = partial(self._files, nested, jvm, fmt, NESTED_TRANSFORM)
                if size in peer_sizes:
                    systems["spark_structured_streaming"] = partial(self._structured_streaming, flat)
                    systems["spark_structured_streaming_nested"] = partial(
                        self._structured_streaming, nested, nested=True
                    )
                rounds = self._rounds(f"nested {size} records", systems, report.nested_summary)
            out[str(size)] = {
                "json_value_bytes": RECORD_BYTES,
                "nested_value_bytes": NESTED_RECORD_BYTES,
                "rounds": rounds,
            }
        self.record("nested", out)

    # 4d.
    def nested_avro(self, sizes: tuple[int, ...], peer_sizes: tuple[int, ...]) -> None:
        """The nested step's orders as Avro in the registry wire format: per round, the files pipeline
        (writing the items as they came), then Structured Streaming with ``from_avro`` and the nested
        schema at ``peer_sizes``; ratios within each round."""
        from bench.avro_topic import produce_avro
        from bench.dataset import NESTED_AVRO_SCHEMA, nested_fields

        out: dict[str, Any] = {}
        for size in sizes:
            with self._topics() as topics:
                avro = produce_avro(
                    self.settings, size, self.workdir, NESTED_AVRO_SCHEMA, nested_fields, "bench-nestedavro"
                )
                topics.append(avro.data.topic)
                say(
                    f"data set: {size} nested records as Avro in {avro.data.topic} "
                    f"({avro.data.produce_s:.1f}s, {avro.value_bytes:.1f} bytes a value, schema id "
                    f"{avro.schema_id} in {avro.registry})"
                )
                systems = {
                    "files_nested_avro": partial(
                        self._files, avro.data, avro.settings, avro.fmt, NESTED_TRANSFORM
                    )
                }
                if size in peer_sizes:
                    systems["spark_structured_streaming_nested_avro"] = partial(
                        self._structured_streaming, avro.data, avro.fmt.reader_schema, nested=True
                    )
                rounds = self._rounds(f"nested Avro {size} records", systems, report.nested_avro_summary)
            out[str(size)] = {
                "avro_value_bytes": avro.value_bytes,
                "registry": avro.registry,
                "rounds": rounds,
            }
        self.record("nested_avro", out)

    # 4e.
    def delta(
        self, sizes: tuple[int, ...], peer_sizes: tuple[int, ...], commit_sizes: tuple[int, ...]
    ) -> None:
        """The Delta sink beside the files and Iceberg sinks on the same topic: per round, in alternating
        order, the exactly-once pipeline into each (every run's committed and visible rows checked), then
        at ``peer_sizes`` Structured Streaming's own Delta sink (its table's rows checked); ratios within
        each round. Then the Delta commit's time at ``commit_sizes`` (none when step 3 measures it)."""
        out: dict[str, Any] = {}
        for size in sizes:
            with self._topics() as topics:
                data = produce(self.settings.kafka_bootstrap, size)
                topics.append(data.topic)
                say(f"data set: {size} records in {data.topic} (produced in {data.produce_s:.1f}s)")
                systems: dict[str, Callable[[], dict[str, Any]]] = {
                    config: partial(self._sink_run, config, data) for config in ("files", "iceberg", "delta")
                }
                if size in peer_sizes:
                    systems["spark_structured_streaming_delta"] = partial(
                        self._structured_streaming, data, delta=True
                    )
                rounds = self._rounds(f"delta {size} records", systems, report.delta_summary, alternate=True)
            out[str(size)] = {"record_bytes": RECORD_BYTES, "rounds": rounds}
        self.record("delta", out)
        if commit_sizes:
            self.commit_cost(commit_sizes, kinds=("delta",))

    # 4f.
    def s3(self, sizes: tuple[int, ...], peer_sizes: tuple[int, ...], commit_sizes: tuple[int, ...]) -> None:
        """Object storage beside the local disk on the same topic: per round, in alternating order, the
        exactly-once pipeline into Parquet files and into Iceberg, each with its output on the local
        disk and in the stack's bucket (every run's committed rows checked, and its visible rows read
        back through the bucket), then at ``peer_sizes`` Structured Streaming's Parquet file sink into
        the bucket through S3A (the rows its ``_spark_metadata`` log commits read back); ratios within
        each round. Then the files commit in the bucket at ``commit_sizes`` (it must stay flat: the
        commit names the objects the tasks wrote and copies none). Everything the step writes to the
        bucket is under the run's own prefix (`bench.pipelines.s3_root`), deleted at the end."""
        from bench.pipelines import s3_root
        from bench.sinks_check import delete_location

        if self.settings.s3 is None:
            say("s3: no object store (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... are not set); skipped")
            return
        bucket = s3_root(self.workdir)
        say(f"s3: writing under {bucket} at {redact.url(self.settings.s3.endpoint_url or 'AWS')}")
        out: dict[str, Any] = {}
        try:
            for size in sizes:
                with self._topics() as topics:
                    data = produce(self.settings.kafka_bootstrap, size)
                    topics.append(data.topic)
                    say(f"data set: {size} records in {data.topic} (produced in {data.produce_s:.1f}s)")
                    systems: dict[str, Callable[[], dict[str, Any]]] = {
                        config: partial(self._sink_run, config, data)
                        for config in ("files", "files_s3", "iceberg", "iceberg_s3")
                    }
                    if size in peer_sizes:
                        systems["spark_structured_streaming_s3"] = partial(
                            self._structured_streaming, data, s3=f"{bucket}/sss"
                        )
                    rounds = self._rounds(f"s3 {size} records", systems, report.s3_summary, alternate=True)
                out[str(size)] = {"record_bytes": RECORD_BYTES, "rounds": rounds}
            self.record("s3", out)
            if commit_sizes:
                self.bucket_commit(commit_sizes)
        finally:
            delete_location(bucket, self.settings)

    def bucket_commit(self, sizes: tuple[int, ...]) -> None:
        """The files commit in the stack's bucket against epoch size (`commit_cost.BUCKET_KINDS`); the
        run's prefix in the bucket is deleted afterwards."""
        from bench.pipelines import s3_root
        from bench.sinks_check import delete_location

        if self.settings.s3 is None:
            say("commit in a bucket: no object store (AWS_ENDPOINT_URL, ...); skipped")
            return
        try:
            self.commit_cost(sizes, kinds=commit_cost.BUCKET_KINDS)
        finally:
            delete_location(s3_root(self.workdir), self.settings)

    @contextlib.contextmanager
    def _topics(self) -> Iterator[list[str]]:
        """A list for the topics a step creates, deleted when the step is done with them (or fails)."""
        topics: list[str] = []
        try:
            yield topics
        finally:
            delete_topics(self.settings.kafka_bootstrap, topics)

    def _rounds(
        self,
        label: str,
        systems: dict[str, Callable[[], dict[str, Any]]],
        summary: Callable[[dict[str, Any]], str],
        *,
        alternate: bool = False,
    ) -> list[dict[str, Any]]:
        """``self.runs`` rounds of every system in turn, back to back, each under its key with the load
        average before and after the round; ``summary`` makes a round's log line. ``alternate``: every
        second round runs the systems in the reverse order, so that none always runs first (on a cold
        cache) or last (on a machine the others have heated)."""
        rounds = []
        for n in range(self.runs):
            entry: dict[str, Any] = {"load_before": load_average(), "runtime": self.runtime}
            order = list(systems.items())
            for key, run in reversed(order) if alternate and n % 2 else order:
                entry[key] = run()
            entry["load_after"] = load_average()
            rounds.append(entry)
            say(f"{label}, round {n + 1}: " + summary(entry))
        return rounds

    def _files(
        self, data: Dataset, settings: Settings, fmt: RecordFormat | None = None, transform: str | None = None
    ) -> dict[str, Any]:
        """One run of the files pipeline over ``data`` (see `_pipeline`), as a round stores it."""
        return self._pipeline(
            "files", data, settings, BATCH_PER_PARTITION, fmt=fmt, transform=transform
        ).to_dict()

    def _sink_run(self, config: str, data: Dataset) -> dict[str, Any]:
        """One run of the pipeline of ``config`` (a `bench.pipelines.SINKS` key) over ``data``."""
        return self._pipeline(config, data, self.settings, BATCH_PER_PARTITION).to_dict()

    def _structured_streaming(
        self,
        data: Dataset,
        avro_schema: str | None = None,
        *,
        nested: bool = False,
        delta: bool = False,
        s3: str | None = None,
    ) -> dict[str, Any]:
        """One run of Structured Streaming over ``data`` (see `peers.runs.structured_streaming`)."""
        from bench.peers import runs as peer_runs

        sss = peer_runs.structured_streaming(
            self.settings,
            data,
            self.workdir,
            BATCH_PER_PARTITION * PARTITIONS,
            avro_schema,
            nested=nested,
            delta=delta,
            s3=s3,
        )
        return dataclasses.asdict(sss) | {"records_per_s": sss.records_per_s}

    def limit_only(self, sizes: tuple[int, ...], key: str = "machine_limit") -> None:
        """Step 4 without the pipelines (the smoke run's stand-in for it, and ``--steps limit``): per size,
        ``self.runs`` rounds of the machine's figures alone, no Spark. Recorded under ``key``, apart from
        the throughput rounds, which a merge must not replace with rounds that have no pipeline in them
        (the smoke run, which has no throughput rounds, records them as its step 4)."""
        out: dict[str, Any] = {}
        for size in sizes:
            data = produce(self.settings.kafka_bootstrap, size)
            rounds = []
            try:
                for n in range(self.runs):
                    entry: dict[str, Any] = {"load_before": load_average()}
                    entry |= machine_figures(self.settings.kafka_bootstrap, data, self.workdir)
                    entry["load_after"] = load_average()
                    rounds.append(entry)
                    say(f"{size} records, round {n + 1}: " + _round_summary(entry))
            finally:
                delete_topics(self.settings.kafka_bootstrap, [data.topic])
            out[str(size)] = rounds
        self.record(key, out)

    # 4f.
    def cuts(self, sizes: tuple[int, ...]) -> None:
        """The cuts toward the machine's limit, each beside the code before it (`bench.cuts`), on the
        largest of ``sizes``."""
        from bench import cuts

        size = max(sizes)
        data = produce(self.settings.kafka_bootstrap, size)
        say(f"data set: {size} records in {data.topic} (produced in {data.produce_s:.1f}s)")
        try:
            out = {
                "records": size,
                "read_task": cuts.read_task_rounds(self.settings, data, self.workdir, self.runs, say),
                "task_size": self._rounds(
                    f"task size, {size} records",
                    {
                        f"tasks_{records}": partial(self._task_size_run, data, records)
                        for records in cuts.TASK_SIZES
                    },
                    cuts.task_size_summary,
                    alternate=True,
                ),
            }
        finally:
            delete_topics(self.settings.kafka_bootstrap, [data.topic])
        self.record("cuts", {str(size): out})

    # 4g.
    def profile(self, sizes: tuple[int, ...]) -> None:
        """Where the files pipeline's time goes (`bench.profile`), at the largest of ``sizes``."""
        from bench import profile

        size = max(sizes)
        data = produce(self.settings.kafka_bootstrap, size)
        say(f"data set: {size} records in {data.topic} (produced in {data.produce_s:.1f}s)")
        try:
            out = profile.measure(lambda: self._sink_run("files", data), size, self.workdir, say)
        finally:
            delete_topics(self.settings.kafka_bootstrap, [data.topic])
        self.record("profile", {str(size): out | {"runtime": self.runtime}})

    def _task_size_run(self, data: Dataset, records: int) -> dict[str, Any]:
        run = self._pipeline("files", data, self.settings, BATCH_PER_PARTITION, max_records_per_task=records)
        return run.to_dict()

    # 5b.
    def runtime_memory(self, pipelines: int, epochs: int) -> None:
        """The warm runtime's memory over many distinct pipelines (`bench.runtime_memory`)."""
        from bench import runtime_memory

        settings = self.warm("runtime_memory")
        if settings is None or self.remote is None:
            return
        out = runtime_memory.measure(
            settings, self.workdir, self.remote, pipelines=pipelines, epochs=epochs, say=say
        )
        say(
            f"runtime memory: start {out['start']['total_mb']:.0f} MB, "
            f"peak {out['peak']['total_mb']:.0f} MB, end {out['end']['total_mb']:.0f} MB, flat: {out['flat']}"
        )
        self.results["runtime_memory"] = out  # replaced whole: its samples belong to one run

    # 5.
    def memory(self, size: int) -> None:
        """Epochs of a fixed batch (10^5 records) taken from a data set 10x (or more) larger."""
        batch = MEMORY_BATCH_PER_PARTITION * PARTITIONS
        epochs = max(self.runs, 1)
        data = produce(self.settings.kafka_bootstrap, max(size, 10 * batch), "bench-memory")
        try:
            run = self._pipeline(
                "files", data, self.settings, MEMORY_BATCH_PER_PARTITION, stop_after=batch * epochs
            )
        finally:
            delete_topics(self.settings.kafka_bootstrap, [data.topic])
        self.results["memory_bounded"] = {  # replaced whole: its epochs belong to one run
            "runtime": self.runtime,
            "topic_records": data.records,
            "batch_records": batch,
            **run.to_dict(),
        }
        say(f"memory: {len(run.epochs)} epochs of {batch} from a topic of {data.records}")

    def _pipeline(
        self,
        config: str,
        data: Dataset,
        settings: Settings,
        batch_per_partition: int,
        *,
        stop_after: int | None = None,
        remote: str | bool | None = True,
        fmt: RecordFormat | None = None,
        transform: str | None = None,
        max_records_per_task: int | None = None,
    ) -> PipelineRun:
        """``remote``: True for the bench's runtime (the warm one when set), else the server or None.
        ``fmt``: the format of an Avro or nested data set (flat JSON otherwise), with its ``transform``."""
        from bench import sinks_check

        kind = "avro" if isinstance(fmt, AvroFormat) else "nested" if fmt is not None else ""
        name = f"bench-{config.replace('_', '')}{kind}-{uuid.uuid4().hex[:8]}"
        spec = bench_pipeline(
            config,
            name,
            data.topic,
            self.workdir,
            batch_per_partition=batch_per_partition,
            fmt=fmt,
            transform=transform,
            max_records_per_task=max_records_per_task,
        )
        records = min(stop_after or data.records, data.records)
        server = self.remote if remote is True else (remote or None)
        run = run_to_end(spec, settings, records, server)
        try:
            if stop_after is None:
                expected = kept(data.records)
                visible = sinks_check.visible_rows(spec, settings)
                if run.committed_rows != expected or visible != expected:
                    raise RuntimeError(
                        f"{name}: {run.committed_rows} rows committed and {visible} visible, "
                        f"expected {expected}"
                    )
        finally:
            sinks_check.drop_output(spec, settings)
        return run


def _round_summary(entry: dict[str, Any]) -> str:
    parts = []
    for key in (
        "machine_limit",
        "jvm_consumer",
        "native_decode_write",
        "limit",
        *PIPELINE_CONFIGS,
        "spark_structured_streaming",
        "quix_streams",
    ):
        if key in entry:
            label = {"machine_limit": "machine's limit", "limit": "one Python consumer"}.get(key, key)
            parts.append(f"{label} {entry[key]['records_per_s']:.0f}/s")
    return ", ".join(parts)


def _deep_merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    merged = dict(old)
    for key, value in new.items():
        merged[key] = _deep_merge(old[key], value) if isinstance(old.get(key), dict) else value
    return merged


def _save(results: dict[str, Any], out: Path, started: float) -> None:
    meta = results["meta"]
    this_run = meta["merged"][-1] if meta.get("merged") else meta  # a merge keeps the first run's times
    this_run["load_after"] = load_average()
    this_run["duration_s"] = time.time() - started
    (out / "report.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    report.write(results, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="onceflow benchmarks: writes bench/report.md, .json, .png")
    parser.add_argument("--sizes", help="comma-separated data-set sizes (default 10^5,10^6)")
    parser.add_argument("--full", action="store_true", help="sizes 10^5, 10^6 and 10^7, commit up to 10^7")
    parser.add_argument(
        "--pg-sizes", help="sizes at which the PostgreSQL exactly-once/at-least-once pair runs (default: all)"
    )
    parser.add_argument(
        "--peer-sizes", help="sizes at which Structured Streaming and quix-streams run (default: all)"
    )
    parser.add_argument(
        "--nested-jvm-sizes",
        help="sizes at which the nested step also runs the JVM read path (default: all; 0 for none)",
    )
    parser.add_argument("--commit-sizes", help="comma-separated epoch sizes for the commit benchmark")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (>= 3 for the report)")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for report.md/json/png")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temp one)")
    parser.add_argument(
        "--steps",
        help="comma-separated subset of: startup,overhead,latency,follow,jobs,airflow,commit,"
        "protocol,throughput,avro,nested,nested_avro,delta,s3,memory,runtime_memory,limit,cuts,profile "
        "(default: all but s3, runtime_memory, limit, cuts and profile)",
    )
    parser.add_argument(
        "--runtime-pipelines", type=int, default=100, help="distinct pipelines of the runtime_memory step"
    )
    parser.add_argument(
        "--runtime-epochs", type=int, default=1000, help="epochs in all of the runtime_memory step"
    )
    parser.add_argument(
        "--merge", action="store_true", help="update --out/report.json with these steps' results"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, one run, no Spark: checks the harness and report"
    )
    args = parser.parse_args(argv)

    settings = Settings.from_env()
    sizes = FULL_SIZES if args.full else DEFAULT_SIZES
    if args.sizes:
        sizes = tuple(int(float(s)) for s in args.sizes.split(","))
    commit_sizes = (*COMMIT_SIZES, 10_000_000) if args.full else COMMIT_SIZES
    pg_sizes = tuple(int(float(s)) for s in args.pg_sizes.split(",")) if args.pg_sizes else sizes
    peer_sizes = tuple(int(float(s)) for s in args.peer_sizes.split(",")) if args.peer_sizes else sizes
    jvm_sizes = (
        tuple(int(float(s)) for s in args.nested_jvm_sizes.split(",")) if args.nested_jvm_sizes else sizes
    )
    if args.commit_sizes:
        commit_sizes = tuple(int(float(s)) for s in args.commit_sizes.split(","))
    if args.smoke:
        sizes, commit_sizes = (2_000,), (1_000,)
    workdir = args.workdir or Path(f"/tmp/onceflow-bench-{uuid.uuid4().hex[:8]}")
    workdir.mkdir(parents=True, exist_ok=True)
    settings = dataclasses.replace(settings, home=workdir)
    with sqlite_ledger(workdir) as url:
        settings = dataclasses.replace(settings, ledger_url=url)
    bench = Bench(settings, workdir, 1 if args.smoke else args.runs)
    started = time.time()
    bench.results["meta"] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": "python -m bench.run " + " ".join(argv if argv is not None else sys.argv[1:]),
        "sizes": list(sizes),
        "commit_sizes": list(commit_sizes),
        "pg_sizes": list(pg_sizes),
        "peer_sizes": list(peer_sizes),
        "runs": bench.runs,
        "record_bytes": RECORD_BYTES,
        "partitions": PARTITIONS,
        "batch_records": BATCH_PER_PARTITION * PARTITIONS,
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "load_before": load_average(),
        "smoke": args.smoke,
        "runtime": bench.runtime,
    }
    protocol_sizes = (1_000,) if args.smoke else tuple(s for s in commit_sizes if s >= 100_000)
    all_steps: dict[str, Callable[[], None]] = {
        "startup": bench.spark_startup,
        "overhead": bench.epoch_overhead,
        "latency": bench.latency,
        "follow": bench.follow,
        "jobs": lambda: bench.spark_jobs(sizes),
        "airflow": bench.airflow_route,
        "commit": lambda: bench.commit_cost(commit_sizes),
        "protocol": lambda: bench.sink_protocol(protocol_sizes),
        "throughput": lambda: bench.throughput(sizes, pg_sizes, peer_sizes),
        "avro": lambda: bench.avro(sizes, peer_sizes),
        "nested": lambda: bench.nested(sizes, peer_sizes, jvm_sizes),
        "nested_avro": lambda: bench.nested_avro(sizes, peer_sizes),
        "delta": lambda: bench.delta(sizes, peer_sizes, () if "commit" in chosen else commit_sizes),
        "s3": lambda: bench.s3(sizes, peer_sizes, commit_sizes),
        "memory": lambda: bench.memory(max(sizes)),
        "runtime_memory": lambda: bench.runtime_memory(args.runtime_pipelines, args.runtime_epochs),
        "limit": lambda: bench.limit_only(sizes),
        "cuts": lambda: bench.cuts(sizes),
        "profile": lambda: bench.profile(sizes),
    }
    if args.smoke:
        all_steps = {
            "commit": all_steps["commit"],
            "s3_commit": lambda: bench.bucket_commit(commit_sizes),  # the s3 step's part without Spark
            "protocol": all_steps["protocol"],
            "limit": lambda: bench.limit_only(sizes, key="throughput"),
        }
    # runtime_memory runs only when asked for: at its default size it takes longer than all the rest; s3
    # too (make bench-s3): its Structured Streaming row needs the AWS SDK bundle (about 600 MB) first.
    # limit only on request too: the throughput step measures the same figures beside the pipelines.
    on_request = () if args.smoke else ("s3", "runtime_memory", "limit", "cuts", "profile")
    chosen = args.steps.split(",") if args.steps else [s for s in all_steps if s not in on_request]
    unknown = sorted(set(chosen) - set(all_steps))
    if unknown:
        parser.error(f"unknown steps {unknown}; known: {', '.join(all_steps)}")
    steps = [(name, all_steps[name]) for name in chosen]
    if args.merge and (args.out / "report.json").exists():
        previous = json.loads((args.out / "report.json").read_text())
        merged_meta = {**previous.get("meta", {}), "merged": [*previous.get("meta", {}).get("merged", [])]}
        merged_meta["merged"].append({"steps": chosen, **bench.results["meta"]})
        bench.results = {**previous, "meta": merged_meta}
        bench.merge_into = previous
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for title, step in steps:
            say(f"step: {title}")
            step()
            _save(bench.results, args.out, started)  # a stopped run still leaves the steps it finished
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    say(f"wrote {args.out / 'report.md'} in {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
