"""The Iceberg sink beside the files and PostgreSQL sinks: commit time per epoch size, and write throughput.

    python -m bench.iceberg_bench [--sizes 1e4,1e5,1e6] [--runs 3] [--pipeline-records 200000]
                                  [--report bench/report.md]

1. Commit time: one epoch staged by 4 writers (as `bench.commit_cost` does for the other sinks), then
   committed by the sink's committer; only the commit is timed. Iceberg's commit is one metadata commit
   (a manifest, a manifest list, the table metadata and the catalog row) whatever the rows.
2. Throughput of the sink path: the same Arrow batches written (as a Spark write task hands them over),
   pre-committed and committed through the Iceberg and the files sinks, back to back in each round,
   without Spark; records per second of the whole path.
3. Pipeline throughput: the benchmark pipeline (`bench.pipelines`) into the files sink and into the
   Iceberg sink, on the same topic, in each round (Spark: the warm runtime when ONCEFLOW_SPARK_REMOTE is
   set).

Prints a markdown section and, with ``--report``, writes it into that file between its own markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import commit_cost
from bench.dataset import PARTITIONS
from bench.report import write_section
from onceflow.config import Settings
from onceflow.sinks import build_committer, build_writer
from onceflow.sinks.base import TaskContext, supports_batches
from onceflow.sinks.iceberg import default_catalog_properties

BEGIN = "<!-- iceberg-bench -->"
END = "<!-- /iceberg-bench -->"


def _iceberg_config(workdir: Path) -> dict[str, Any]:
    return {
        "name": "out",
        "table": f"bench.commit_{uuid.uuid4().hex[:8]}",
        "catalog": f"bench_{workdir.name}",
        "catalog_properties": default_catalog_properties(workdir / "iceberg"),
        "columns": {"id": "long", "amount": "double", "customer": "string"},
        "rows_per_file": 1_000_000,
    }


def iceberg_seconds(rows: int, workdir: Path, topic: str) -> float:
    """Seconds to commit one epoch of ``rows`` rows, staged by 4 writers, into a new Iceberg table."""
    config = _iceberg_config(workdir)
    committables = commit_cost.stage("iceberg", config, f"bench-ice-{uuid.uuid4().hex[:6]}", rows, topic)
    started = time.perf_counter()
    build_committer("iceberg", config).commit(committables)
    return time.perf_counter() - started


def task_batches(rows: int) -> list[list[Any]]:
    """Each of the 4 tasks' rows as Arrow record batches of 10,000 rows, as a Spark task receives them."""
    import pyarrow as pa

    per_task = rows // PARTITIONS
    out = []
    for task in range(PARTITIONS):
        data = list(commit_cost._rows("files", task, per_task))
        out.append([pa.RecordBatch.from_pylist(data[i : i + 10_000]) for i in range(0, len(data), 10_000)])
    return out


def batch_path_seconds(kind: str, config: dict[str, Any], batches: list[list[Any]]) -> float:
    """Seconds for 4 writers to stage their batches (``write_batch`` when the writer has it, as in a
    Spark task) and pre-commit, and for the committer to commit the epoch."""
    started = time.perf_counter()
    committables = []
    pipeline = f"bench-path-{uuid.uuid4().hex[:6]}"
    for task, task_data in enumerate(batches):
        writer = build_writer(kind, config)
        writer.begin(TaskContext(pipeline, 1, 0, f"s0-t{task}", "a0", "out"))
        for batch in task_data:
            if supports_batches(writer):
                writer.write_batch(batch)
            else:
                writer.write(batch.to_pylist())
        committables.append(writer.pre_commit())
    build_committer(kind, config).commit(committables)
    return time.perf_counter() - started


def pipeline_throughput(records: int, runs: int, settings: Settings, workdir: Path) -> dict[str, list[float]]:
    """Records/s of the benchmark pipeline (decode, filter, projection) into the files sink and into the
    Iceberg sink, on the same topic, both in each round (in alternating order), on the warm Spark runtime when
    ONCEFLOW_SPARK_REMOTE is set (else spark-submit); one epoch per run."""
    from bench import dataset
    from bench.epochs import run_to_end
    from bench.pipelines import bench_pipeline
    from onceflow.ledger import Ledger
    from onceflow.pipeline import SinkSpec

    ledger_url = f"sqlite:///{workdir / 'ledger.db'}"
    run_settings = Settings.from_env({**os.environ, "ONCEFLOW_LEDGER_URL": ledger_url})
    with Ledger.connect(ledger_url, check=False) as ledger:
        ledger.upgrade()
    data = dataset.produce(settings.kafka_bootstrap, records, prefix="bench-ice-in")
    found: dict[str, list[float]] = {"files": [], "iceberg": []}
    again: list[str] = []  # the runs made twice: the first one failed (printed with the figures)
    try:
        for round_number in range(runs + 1):  # round 0 warms the runtime and both sinks up: dropped
            for kind in ("files", "iceberg") if round_number % 2 else ("iceberg", "files"):
                name = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
                spec = bench_pipeline(
                    "files", name, data.topic, workdir, batch_per_partition=records // dataset.PARTITIONS + 1
                )
                if kind == "iceberg":
                    config = {**_iceberg_config(workdir), "rows_per_file": 100_000}
                    config.pop("name")
                    spec = dataclasses.replace(spec, sinks=(SinkSpec("out", "iceberg", config),))
                try:
                    run = run_to_end(spec, run_settings, records, run_settings.spark_remote)
                except Exception as exc:  # a shared runtime restarted under the run: once more, anew
                    print(f"[bench] {kind} run failed ({exc}); running it again", file=sys.stderr)
                    again.append(f"round {round_number} {kind}: {str(exc).splitlines()[0][-160:]}")
                    spec = dataclasses.replace(spec, name=f"{spec.name}-again")
                    run = run_to_end(spec, run_settings, records, run_settings.spark_remote)
                if round_number:
                    found[kind].append(run.records_per_s)
    finally:
        dataset.delete_topics(settings.kafka_bootstrap, [data.topic])
    PIPELINE_RETRIES[:] = again
    return found


# The pipeline runs `pipeline_throughput` had to make twice, and why (the report says so).
PIPELINE_RETRIES: list[str] = []


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def run(sizes: list[int], runs: int, settings: Settings, pipeline_records: int = 0) -> str:
    topic = "bench-iceberg-input"  # named in the committables only; the Kafka sink is not run here
    commit: dict[str, dict[int, list[float]]] = {
        k: {n: [] for n in sizes} for k in ("iceberg", "files", "pg")
    }
    throughput: dict[str, list[float]] = {"iceberg": [], "files": []}
    largest = max(sizes)
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-iceberg-") as tmp:
        workdir = Path(tmp)
        for _ in range(runs):
            for n in sizes:
                commit["iceberg"][n].append(iceberg_seconds(n, workdir, topic))
                for kind, key in (("files", "files"), ("postgres_2pc", "pg")):
                    commit[key][n].append(commit_cost.commit_seconds(kind, n, workdir, settings, topic))
        batches = task_batches(largest)
        for _ in range(runs + 1):  # the first round warms both sinks up (imports, catalog): dropped
            files_config = {"root": str(workdir / "path"), "table": uuid.uuid4().hex[:8], "name": "out"}
            ice = batch_path_seconds("iceberg", _iceberg_config(workdir), batches)
            fil = batch_path_seconds("files", files_config, batches)
            throughput["iceberg"].append(largest / ice)
            throughput["files"].append(largest / fil)
        pipelines = pipeline_throughput(pipeline_records, runs, settings, workdir) if pipeline_records else {}
    lines = [
        BEGIN,
        "## Iceberg sink",
        "",
        f"Measured by `python -m bench.iceberg_bench --sizes {','.join(f'{n:.0e}' for n in sizes)} "
        f"--runs {runs} --pipeline-records {pipeline_records}` "
        f"on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} (load average "
        f"{[round(x, 2) for x in os.getloadavg()]}, 2 cores). Medians of {runs} rounds, min–max in brackets.",
        "",
        "Commit time of one epoch staged by 4 writers (seconds; only the commit is timed):",
        "",
        "| rows | iceberg | files | postgres_2pc |",
        "| --- | --- | --- | --- |",
    ]
    for n in sizes:
        lines.append(
            f"| {n:,} | {_median(commit['iceberg'][n])} | {_median(commit['files'][n])} | "
            f"{_median(commit['pg'][n])} |"
        )
    ice, fil = statistics.median(throughput["iceberg"][1:]), statistics.median(throughput["files"][1:])
    ratios = [i / f for i, f in zip(throughput["iceberg"][1:], throughput["files"][1:], strict=True)]
    lines += [
        "",
        f"Sink path at {largest:,} rows, as Spark write tasks run it but without Spark: 4 writers take the "
        "rows as Arrow batches of 10,000 (`write_batch`), pre-commit, then one commit; the two sinks back "
        f"to back in each round, after a warm-up round that is not counted. Records/s (median): iceberg "
        f"{ice:,.0f}, files {fil:,.0f}; iceberg ÷ files per round: "
        f"{', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f}).",
    ]
    if pipelines:
        ratios = [i / f for i, f in zip(pipelines["iceberg"], pipelines["files"], strict=True)]
        remote = os.environ.get("ONCEFLOW_SPARK_REMOTE")
        lines += [
            "",
            f"Pipeline throughput, {pipeline_records:,} records (decode, filter, projection; one epoch per "
            f"run) {'on the warm Spark runtime' if remote else 'through spark-submit'}, both sinks in each "
            "round on the same topic, in alternating order, after a warm-up round that is not counted. "
            f"Records/s: files {', '.join(f'{v:,.0f}' for v in pipelines['files'])}; iceberg "
            f"{', '.join(f'{v:,.0f}' for v in pipelines['iceberg'])}; iceberg ÷ files per round: "
            f"{', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f}).",
        ]
        lines += [f"Made twice (the first attempt failed): {r}." for r in PIPELINE_RETRIES]
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.iceberg_bench", description=__doc__)
    parser.add_argument("--sizes", default="1e4,1e5,1e6", help="epoch sizes in rows, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--pipeline-records",
        type=int,
        default=200_000,
        help="records of the pipeline comparison (0: skip it)",
    )
    parser.add_argument("--report", type=Path, default=None, help="write the section into this markdown file")
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    section = run(sizes, args.runs, Settings.from_env(), args.pipeline_records)
    print(section)
    if args.report is not None:
        write_section(args.report, section, BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
