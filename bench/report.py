"""Render the benchmark results (report.json) as bench/report.md and bench/report.png."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.stats import median, spread

CONFIG_LABELS = {
    "files": "onceflow exactly-once → Parquet files",
    "postgres_2pc": "onceflow exactly-once → PostgreSQL 2PC",
    "plain": "onceflow at-least-once → PostgreSQL plain",
    "spark_structured_streaming": "Spark Structured Streaming (availableNow, foreachBatch → Parquet)",
    "quix_streams": "quix-streams exactly-once → Kafka",
}
STEPS = ("recover_s", "plan_s", "startup_s", "processing_s", "decide_s", "commit_s")
STEP_LABELS = {
    "recover_s": "recover",
    "plan_s": "plan",
    "startup_s": "spark-submit start-up",
    "processing_s": "processing (slice job minus start-up)",
    "decide_s": "decision (ledger)",
    "commit_s": "commit (sink)",
}


def _fmt(x: float, digits: int = 3) -> str:
    if x != x:  # nan
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _sizes(results: dict[str, Any]) -> list[str]:
    return sorted(results.get("throughput", {}), key=int)


def _rate(entry: dict[str, Any], key: str) -> float:
    return float(entry[key]["records_per_s"]) if key in entry else float("nan")


# What the machine can do with the data set (`bench.limit`), in the order of the throughput table: the
# round's key and the table's name for it. One Python consumer keeps the key "limit" older reports have.
MACHINE_LABELS = {
    "machine_limit": "the machine's limit: JVM consumer's read + native decode and write",
    "jvm_consumer": "Kafka's JVM consumer (ConsumerPerformance), read only",
    "native_decode_write": "native decode + filter + projection + Parquet (pyarrow), in memory",
    "limit": "one Python consumer (confluent-kafka), read only",
}
MISSING = "—"  # a figure an older report's rounds do not hold


def ratios(round_: dict[str, Any]) -> dict[str, float]:
    """Every ratio of one round (measured within it); nan where a system did not run in it."""
    files, pg = _rate(round_, "files"), _rate(round_, "postgres_2pc")
    machine = _rate(round_, "machine_limit")
    return {
        "eo_vs_alo": pg / _rate(round_, "plain") if "plain" in round_ else math.nan,
        "files_vs_machine": files / machine,
        "files_vs_limit": files / _rate(round_, "limit"),
        "files_vs_sss": files / _rate(round_, "spark_structured_streaming"),
        "files_vs_quix": files / _rate(round_, "quix_streams"),
        "pg_vs_machine": pg / machine,
        "pg_vs_limit": pg / _rate(round_, "limit"),
        "pg_vs_sss": pg / _rate(round_, "spark_structured_streaming"),
        "pg_vs_quix": pg / _rate(round_, "quix_streams"),
    }


# The ratios table's columns: each `ratios` key and its heading.
RATIO_LABELS = {
    "eo_vs_alo": "exactly-once ÷ at-least-once (PostgreSQL 2PC ÷ plain)",
    "files_vs_machine": "files pipeline ÷ machine's limit",
    "files_vs_limit": "files pipeline ÷ one Python consumer",
    "files_vs_sss": "files pipeline ÷ Structured Streaming",
    "files_vs_quix": "files pipeline ÷ quix-streams",
    "pg_vs_machine": "PostgreSQL 2PC ÷ machine's limit",
    "pg_vs_limit": "PostgreSQL 2PC ÷ one Python consumer",
    "pg_vs_sss": "PostgreSQL 2PC ÷ Structured Streaming",
    "pg_vs_quix": "PostgreSQL 2PC ÷ quix-streams",
}


def epoch_steps(results: dict[str, Any], backend: str) -> dict[str, list[float]]:
    startup = median(results.get("spark_startup_s", []))
    epochs = results["overhead"]["ledgers"][backend]
    steps: dict[str, list[float]] = {s: [] for s in (*STEPS, "coordination_s")}
    for e in epochs:
        for s in ("recover_s", "plan_s", "decide_s", "commit_s"):
            steps[s].append(e[s])
        steps["startup_s"].append(startup)
        steps["processing_s"].append(e["spark_s"] - startup)
        steps["coordination_s"].append(e["recover_s"] + e["plan_s"] + e["decide_s"])
    return steps


def _power(size: str) -> str:
    """ "10^6" for "1000000"."""
    return f"10^{len(size) - 1}" if size.strip("0") == "1" else f"{int(size):,}"


# The sustained targets: exactly-once ÷ at-least-once, the files pipeline ÷ the machine's limit, and ÷
# each peer (1.5× Structured Streaming at 10^6, 1.2× elsewhere).
EO_VS_ALO = 0.95
VS_MACHINE = 0.5
# The peer targets above the default 1.2×: the PostgreSQL two-phase pipeline is the figure users compare
# with their own foreachBatch and JDBC, at both sizes.
VS_PEER = {
    ("files_vs_sss", "1000000"): 1.5,
    ("pg_vs_sss", "1000000"): 1.5,
    ("pg_vs_sss", "10000000"): 1.5,
}
# The pipelines the sustained targets hold for: (ratio key prefix, how the target row names it).
SUSTAINED = (("files", "pipeline"), ("pg", "PostgreSQL two-phase pipeline"))


def _at_least(
    target: str, values: list[float], bar: float, *, spread_shown: bool = True
) -> tuple[str, str, str]:
    """The (target, measured, verdict) row of a ratio target: the median of ``values`` against ``bar``."""
    m = median(values)
    measured = f"{m:.3f}× ({spread(values)})" if spread_shown else f"{m:.3f}×"
    return target, measured, "met" if m >= bar else "MISSED"


def targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows."""
    rows = []
    tp = results.get("throughput", {})
    # Each round's ratios, once: every ratio target below reads them.
    measured = {size: [(r, ratios(r)) for r in rounds] for size, rounds in tp.items()}
    for size in _sizes(results):
        values = [q["eo_vs_alo"] for r, q in measured[size] if "plain" in r]
        if values:
            target = f"exactly-once ≥ {EO_VS_ALO}× at-least-once, whole pipeline ({int(size):,} records)"
            rows.append(_at_least(target, values, EO_VS_ALO))
    for size, rounds in results.get("sink_protocol", {}).items():
        values = [r["plain_s"] / r["postgres_2pc_s"] for r in rounds]
        rows.append(
            _at_least(
                f"exactly-once ≥ {EO_VS_ALO}× at-least-once, sink alone ({int(size):,} rows)",
                values,
                EO_VS_ALO,
            )
        )
    # The sustained targets, at 10^6 and at 10^7 (the issue's own size) wherever they were measured.
    sustained = [size for size in ("1000000", "10000000") if size in tp and "files" in tp[size][0]]
    against_machine = False
    for size in sustained:
        for prefix, what in SUSTAINED:
            key = f"{prefix}_vs_machine"
            values = [q[key] for _, q in measured[size] if not math.isnan(q[key])]
            if values:
                target = f"{what} ≥ {VS_MACHINE}× the machine's limit at {_power(size)} records"
                rows.append(_at_least(target, values, VS_MACHINE, spread_shown=False))
                against_machine |= prefix == "files" and size == "10000000"
    if not against_machine:
        target = f"pipeline ≥ {VS_MACHINE}× the machine's limit at 10^7 records"
        rows.append((target, "not measured", "not measured"))
    cost = results.get("commit_cost", {})
    for kind in ("postgres_2pc", "files"):
        by_size = cost.get(kind, {})
        if "10000000" in by_size:
            m = median(by_size["10000000"])
            rows.append((f"{kind} commit ≤ 1 s at 10^7 records", f"{m:.3f} s", "met" if m <= 1 else "MISSED"))
        elif by_size:
            largest = max(by_size, key=int)
            m = median(by_size[largest])
            rows.append(
                (
                    f"{kind} commit ≤ 1 s at 10^7 records",
                    f"{m:.3f} s at {int(largest):,} (10^7 not run; use --full)",
                    "not measured at 10^7",
                )
            )
    for size in sustained:
        for prefix, what in SUSTAINED:
            for peer, key in (
                ("Spark Structured Streaming", f"{prefix}_vs_sss"),
                ("quix-streams", f"{prefix}_vs_quix"),
            ):
                values = [q[key] for _, q in measured[size] if not math.isnan(q[key])]
                if values:
                    bar = VS_PEER.get((key, size), 1.2)
                    rows.append(_at_least(f"{what} ≥ {bar}× {peer} at {_power(size)} records", values, bar))
    rows += _nested_targets(results)
    rows += _delta_targets(results)
    rows += [row for row in [_s3_commit(results)] if row is not None]
    for size, runs in results.get("spark_jobs", {}).items():
        per_slice = median(r["jobs"] / max(r["slices"], 1) for r in runs)
        shuffled = max(r["shuffle_read_bytes"] + r["shuffle_write_bytes"] for r in runs)
        rows.append(
            (
                f"one Spark job and no shuffle per slice, files pipeline ({_power(size)} records)",
                f"{per_slice:g} job(s) per slice, {shuffled:,} shuffle bytes",
                "met" if per_slice <= 1 and shuffled == 0 else "MISSED",
            )
        )
    route = results.get("airflow_route")
    if route:
        m = route["queued_to_committed_median_s"]
        rows.append(
            (
                f"through a real Airflow scheduler, {route['records_per_run']:,}-record runs: queued → "
                "committed median ≤ 8 s",
                f"{m:.2f} s",
                "met" if m <= 8 else "MISSED",
            )
        )
    follow = results.get("follow")
    if follow and follow.get("epoch_s"):
        m = median(follow["epoch_s"])
        rows.append(
            (
                f"`--follow`, {follow['records_per_batch']:,}-record epochs: median ≤ 1 s",
                f"{m:.2f} s",
                "met" if m <= 1 else "MISSED",
            )
        )
    latency = results.get("latency")
    if latency and latency.get("connect"):
        m = median(e["total_s"] for e in _latency_epochs(latency["connect"]))
        rows.append(
            (
                "epoch of 1,000 records, plan → commit, warm runtime: median ≤ 3 s",
                f"{m:.2f} s",
                "met" if m <= 3 else "MISSED",
            )
        )
    rows += _epoch_memory_targets(results)
    rows += _runtime_memory_targets(results.get("runtime_memory"))
    for backend in results.get("overhead", {}).get("ledgers", {}):
        m = median(epoch_steps(results, backend)["coordination_s"])
        rows.append(
            (
                f"coordination ≤ 0.5 s per epoch ({backend} ledger)",
                f"{m:.3f} s",
                "met" if m <= 0.5 else "MISSED",
            )
        )
    return rows


# The nested JSON target: the files pipeline ÷ Structured Streaming (nested from_json) at 10^7 records.
NESTED_VS_SSS = 1.2


def _nested_targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The nested JSON target's row, once the nested step has run at 10^7 with Structured Streaming."""
    rounds = results.get("nested", {}).get("10000000", {}).get("rounds", [])
    values = [q for q in (nested_ratios(r)["nested_vs_sss"] for r in rounds) if not math.isnan(q)]
    if not values:
        return []
    target = (
        f"nested JSON pipeline ≥ {NESTED_VS_SSS}× Structured Streaming (nested from_json) at 10^7 records"
    )
    return [_at_least(target, values, NESTED_VS_SSS)]


def _epoch_memory_targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The peak of a 10^6-record epoch on the warm runtime (every runtime process, its Python workers
    and the slice's driver, by PSS) against 1.5 GB; a round measured by resident size is not judged."""
    rounds = [r for r in results.get("throughput", {}).get("1000000", []) if "files" in r]
    epochs = [e for r in rounds for e in r["files"]["epochs"] if e["records"] >= 1_000_000]
    if not epochs or "Connect" not in rounds[0].get("runtime", ""):
        return []
    target = "peak ≤ 1.5 GB during a 10^6-record epoch (warm runtime and the slice's driver, PSS)"
    if any(e.get("memory_measure") != "pss" for e in epochs):
        return [(target, "resident size only (counts forked workers' shared pages again)", "not judged")]
    peaks = [e["peak_total_mb"] for e in epochs]
    shape = "lean runtime" if "lean" in rounds[0]["runtime"] else "master, 2 workers, 2 executors"
    measured = f"{median(peaks):.0f} MB median, {max(peaks):.0f} MB at most ({shape}, {len(peaks)} epochs)"
    return [(target, measured, "met" if median(peaks) <= 1536 else "MISSED")]


def _runtime_memory_targets(run: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """The warm runtime's peak against 1.5 GB, and its flatness at the size actually run: a smaller run
    than 100 pipelines and 1,000 epochs says so instead of claiming the target."""
    if not run:
        return []
    size = f"{run['pipelines']} pipelines, {run['epochs']} epochs"
    full = run["pipelines"] >= 100 and run["epochs"] >= 1000
    if run["flat"] is None or "pace_s" not in run:  # memory alone cannot see a heap at its cap
        flat = "not judged"
    else:
        flat = "MISSED" if not run["flat"] else "met" if full else f"flat at {size} only"
    gc = run.get("gc")
    collected = f", GC {gc['share']:.0%} of the run" if gc else ""
    return [
        (
            "warm runtime's peak ≤ 1.5 GB (distinct small pipelines)",
            f"{run['peak']['total_mb']:.0f} MB ({size})",
            "met" if run["peak_within_target"] else "MISSED",
        ),
        (
            "warm runtime flat over 100 pipelines and 1,000 epochs",
            f"{run['start']['total_mb']:.0f} → {run['end']['total_mb']:.0f} MB at rest, "
            f"{run['end']['python_processes']} Python processes after{collected} ({size})",
            flat,
        ),
    ]


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# onceflow benchmarks",
        "",
        f"Generated by `{meta['command']}` on {meta['started']}, "
        f"in {meta.get('duration_s', 0) / 60:.0f} min."
        + "".join(
            f" Step(s) {', '.join(m['steps'])} measured by `{m['command']}` on {m['started']} "
            f"(load average {m['load_before']}) and merged."
            for m in meta.get("merged", [])
        ),
        f"Machine: {meta['cpus']} cores, {meta['machine']}, Python {meta['python']}. "
        f"Load average before/after: {meta['load_before']} / {meta.get('load_after')}.",
        "",
        f"Data: {meta['record_bytes']}-byte JSON records in {meta['partitions']} partitions; sizes "
        f"{', '.join(f'{int(s):,}' for s in _sizes(results) or meta['sizes'])}. Work: JSON decode, a "
        "filter keeping 90 %, a projection to 3 columns. "
        f"Every figure is the median of {meta['runs']} runs (min–max in brackets); "
        "every ratio is taken within one round (all systems back to back on the same data), then the median "
        "of the rounds.",
        "",
    ]
    busy = _busy_runs(meta)
    if busy:
        lines += [
            "**Part of this report was measured on a shared machine** ("
            + "; ".join(f"{label}: 1-minute load average {load:.1f} when it started" for label, load in busy)
            + f", on {meta['cpus']} cores, from other workloads): those figures are pessimistic and noisy; "
            "the ratios, taken within a round, are less affected. Re-run those steps on a quiet machine.",
            "",
        ]
    lines += _targets_section(results)
    lines += _notes_section(results)
    lines += _throughput_section(results)
    lines += _machine_limit_section(results)
    lines += _cuts_section(results)
    lines += _profile_section(results)
    lines += _avro_section(results)
    lines += _nested_section(results)
    lines += _nested_avro_section(results)
    lines += _delta_section(results)
    lines += _s3_section(results)
    lines += _commit_section(results)
    lines += _protocol_section(results)
    lines += _overhead_section(results)
    lines += _latency_section(results)
    lines += _follow_section(results)
    lines += _jobs_section(results)
    lines += _airflow_section(results)
    lines += _memory_section(results)
    lines += _runtime_memory_section(results)
    lines += ["", "![plots](report.png)", ""]
    return "\n".join(lines)


def _busy_runs(meta: dict[str, Any]) -> list[tuple[str, float]]:
    """The runs (the first one, then each merged step) that started with a load above half the cores.

    Only the load before a run counts: afterwards, the 1-minute average mostly holds the run's own work."""
    runs = [("the first run", meta)] + [
        (f"step(s) {', '.join(m['steps'])}", m) for m in meta.get("merged", [])
    ]
    busy = []
    for label, run in runs:
        load = run["load_before"][0]
        if load > 0.5 * (meta.get("cpus") or 1):
            busy.append((label, load))
    return busy


def _targets_section(results: dict[str, Any]) -> list[str]:
    lines = ["## Targets", "", "| target | measured | verdict |", "| --- | --- | --- |"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in targets(results)]
    return [*lines, ""]


def _startup_share(results: dict[str, Any], size: str) -> tuple[float, float] | None:
    """(share of the files pipeline's wall time spent starting spark-submits, rate without them)."""
    startup = median(results.get("spark_startup_s", []))
    rounds = [r["files"] for r in results.get("throughput", {}).get(size, []) if "files" in r]
    if not rounds or startup != startup:
        return None
    shares = [len(r["epochs"]) * startup / r["wall_s"] for r in rounds]
    rates = [r["records"] / max(r["wall_s"] - len(r["epochs"]) * startup, 1e-9) for r in rounds]
    return median(shares), median(rates)


def _notes_section(results: dict[str, Any]) -> list[str]:
    """What was compared, and why the missed targets were missed (with this run's own numbers)."""
    lines = [
        "## What was compared, and why targets were missed",
        "",
        "- **Exactly-once vs at-least-once.** onceflow runs both guarantees through the same plan / Spark "
        "slice / pre-commit / decide / commit protocol and ledger; what differs is the sink. The "
        "at-least-once run writes with the `plain` sink (rows appended with COPY and visible at once, "
        "nothing staged, a no-op commit); the exactly-once run writes the same rows to the same PostgreSQL "
        "with `postgres_2pc` (COPY inside a prepared transaction with a marker row, COMMIT PREPARED by the "
        "coordinator). The ratio is therefore the cost of staging and two-phase commit in the sink. "
        "Through Spark on a busy machine the run-to-run spread of one slice job is far larger than that "
        "cost (see the min–max), so the sink-alone comparison below measures it without Spark.",
        "- **Peers.** Structured Streaming reads with Spark's own (JVM) Kafka source, decodes with "
        "`from_json` and writes Parquet per micro-batch (`foreachBatch`, overwrite of `batch=<id>`, "
        'idempotent); quix-streams runs with `processing_guarantee="exactly-once"` and writes to a '
        "Kafka topic in transactions (its exactly-once covers Kafka outputs only). onceflow's row in the "
        "comparison is the exactly-once Parquet pipeline. Same data, same filter and projection, "
        "`local[2]` for both Spark systems.",
    ]
    biggest = max(_sizes(results), key=int, default=None)
    first_rounds = {size: results["throughput"][size][0] for size in _sizes(results)}
    warm = [s for s, r in first_rounds.items() if "Connect" in r.get("runtime", "") and "files" in r]
    share = _startup_share(results, biggest) if biggest and not warm else None
    if warm:
        size = max(warm, key=int)
        runs = [r["files"] for r in results["throughput"][size]]
        process = median(sum(e["spark_s"] for e in run["epochs"]) / run["wall_s"] for run in runs)
        rate = median(run["records_per_s"] for run in runs)
        lines.append(
            f"- **The pipeline on the warm runtime ({int(size):,} records).** No JVM "
            f"start-up per epoch any more: the pipeline ran at {rate:,.0f} records/s, {process * 100:.0f} % "
            "of it in the process step, where each Spark task's Python worker reads its exact range with "
            "a Kafka consumer and decodes what each fetch brings, about 10,000 records at a time, with "
            "Arrow's JSON reader where it provably agrees with the record-by-record decoder "
            "(`ONCEFLOW_JSON_READ=python`, the default), the transform runs in the JVM, and the write tasks "
            "stage Arrow batches; an epoch of 10^6 records is 4 read tasks of 250,000. The Python workers "
            "are the largest part of the CPU: where it goes, part by part, is in the profile section "
            "below (`--steps profile`), and each cut that brought it there is measured beside the code "
            "before it (`--steps cuts`). The JVM path (`ONCEFLOW_JSON_READ=jvm`: "
            "Spark's Kafka source, `from_json` and the checks that prove which records the JVM may accept) "
            "took 12.5-13.8 s for the epoch the Python reader then did in 7.5 s; one parse into a Variant "
            "instead of its two (`bench/one_parse.py`) was slower still; Spark's Kafka source feeding "
            "Arrow's JSON reader in the Python workers ran the files pipeline at 157 k records/s where the "
            "Python reader ran at 249 k (one run each, 10^7 records, tasks of 50,000). All of it shares 2 "
            "cores with the "
            "Kafka broker, PostgreSQL and the driver."
        )
    lines += _where_the_time_goes(results)
    if share is not None:
        startup = median(results.get("spark_startup_s", []))
        lines.append(
            f"- **The pipeline through spark-submit.** Every epoch is one spark-submit, whose start-up alone "
            f"took {startup:.1f} s (median) here: {share[0] * 100:.0f} % of the files pipeline's wall time "
            f"at {int(biggest):,} records. Without it the pipeline ran at {share[1]:,.0f} records/s. The "
            "rest is the row path in Python: each executor reads with confluent-kafka (a Python object "
            "per record) and decodes JSON in Python, because every record must become a row or a dead "
            "letter with its reason; rows then cross to the JVM for the transform, and back to the sink "
            "writers, as Arrow batches (`mapInArrow`), on 2 cores shared by the driver, the executors and "
            "the services. Remedies not made yet: a long-lived Spark application serving several epochs "
            "(no start-up per epoch), and decoding in the JVM (`from_json`) with only the records it "
            "rejects examined "
            "in Python for their reason."
        )
    measured_10m = "10000000" in results.get("commit_cost", {}).get("files", {})
    lines += [
        "- **Commit time.** PostgreSQL's commit is one `COMMIT PREPARED` per task, flat in the rows. The "
        "files commit is one rename per task plus a log entry, but first re-hashes each staged file against "
        "its pre-commit checksum, which grows with the file (about 0.1 s for 10^7 rows here). "
        + (
            "The 10^7 point is measured."
            if measured_10m
            else "The 10^7 point itself is measured only with `--full`."
        )
        + " The Kafka commit publishes the staged records inside the transaction, so it grows linearly "
        "with the epoch by design (the Kafka sink has no 10^7 target)."
        + (
            " The Delta commit is one Delta log entry holding an add action per staged file (one per "
            "100,000 rows of a task) and the epoch's `txn` action: it grows with the files, not the rows."
            if "delta" in results.get("commit_cost", {})
            else ""
        ),
        "",
    ]
    return lines


def _median_cell(values: list[float], digits: int = 3) -> str:
    return f"{median(values):.{digits}f}" if values else MISSING


def _throughput_section(results: dict[str, Any]) -> list[str]:
    tp = results.get("throughput", {})
    if not tp:
        return []
    lines = [
        "## Throughput (records/s, end to end)",
        "",
        "End to end: from the first epoch's recover to the last epoch's commit for onceflow (one epoch per "
        f"{results['meta']['batch_records']:,} records; its runtime per size below), the whole spark-submit "
        "for Structured Streaming, the whole process for quix-streams. Beside them, in every round, on the "
        "same records, what the machine can do with them: one Python consumer is one plain "
        "confluent-kafka consumer reading every record, without decoding; Kafka's JVM consumer is Kafka's "
        "own `ConsumerPerformance` tool reading every record from the start (its fetch time, without the "
        "JVM's start-up and the group join); the native decode is Arrow's C++ JSON reader, the bench's "
        "filter and projection and a Parquet write, over the values held in memory; the machine's limit "
        "is the records over the time of reading (JVM consumer) plus the time of decoding and writing "
        "(native), on the same cores. Each ratio is taken within a round, then the median; "
        f"{MISSING}: not measured in that run.",
        "",
        "| records | system | records/s | MB/s | × one Python consumer | × machine's limit | "
        "in-job processing s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size in _sizes(results):
        rounds = tp[size]
        if any(key in rounds[0] for key in CONFIG_LABELS):
            runtime = rounds[0].get("runtime", "spark-submit, one per slice")
            lines.append(f"| {int(size):,} | *onceflow runtime: {runtime}* | | | | | |")
        rows = [(key, label, True) for key, label in MACHINE_LABELS.items()]
        rows += [(key, label, False) for key, label in CONFIG_LABELS.items() if key in rounds[0]]
        for key, label, machine in rows:
            measured = [r for r in rounds if key in r]
            rates = [r[key]["records_per_s"] for r in measured]
            if not rates:
                lines.append(f"| {int(size):,} | {label} | {MISSING} | {MISSING} | {MISSING} | {MISSING} | |")
                continue
            if machine:
                mb_rate = median([r[key]["mb_per_s"] for r in measured])
            else:
                mb_rate = median(rates) * results["meta"]["record_bytes"] / 1e6
            vs_python = [
                r[key]["records_per_s"] / r["limit"]["records_per_s"] for r in measured if "limit" in r
            ]
            vs_machine = [
                r[key]["records_per_s"] / r["machine_limit"]["records_per_s"]
                for r in measured
                if "machine_limit" in r
            ]
            job = [r[key].get("processing_s", math.nan) for r in measured]
            in_job = _fmt(median(job)) if key in ("spark_structured_streaming", "quix_streams") else ""
            lines.append(
                f"| {int(size):,} | {label} | {_fmt(median(rates))} ({spread(rates)}) | {_fmt(mb_rate)} | "
                f"{_median_cell(vs_python)} | {_median_cell(vs_machine)} | {in_job} |"
            )
    lines += ["", "Ratios (median of the per-round ratios):", ""]
    lines += [
        "| records | " + " | ".join(RATIO_LABELS.values()) + " |",
        "| --- | " + " | ".join("---" for _ in RATIO_LABELS) + " |",
    ]
    for size in _sizes(results):
        rs = [ratios(r) for r in tp[size] if "files" in r]
        if not rs:
            continue
        cells = []
        for k in RATIO_LABELS:
            values = [r[k] for r in rs if r[k] == r[k]]  # nan: not measured at this size
            cells.append(f"{median(values):.3f} ({spread(values)})" if values else MISSING)
        lines.append(f"| {int(size):,} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _machine_limit_section(results: dict[str, Any]) -> list[str]:
    """The machine's figures measured alone (``--steps limit``), when a run measured them so."""
    alone = results.get("machine_limit")
    if not alone:
        return []
    lines = [
        "## The machine's limit, measured alone (records/s)",
        "",
        "The throughput table's machine figures without the pipelines beside them (`--steps limit`): "
        "the same data set, the same measurements, rounds of their own. Median of the rounds "
        "(min–max); each ratio within its round.",
        "",
        "| records | figure | records/s | MB/s | × one Python consumer |",
        "| --- | --- | --- | --- | --- |",
    ]
    for size in sorted(alone, key=int):
        rounds = alone[size]
        for key, label in MACHINE_LABELS.items():
            measured = [r for r in rounds if key in r]
            if not measured:
                continue
            rates = [r[key]["records_per_s"] for r in measured]
            vs_python = [
                r[key]["records_per_s"] / r["limit"]["records_per_s"] for r in measured if "limit" in r
            ]
            mb_rate = median([r[key]["mb_per_s"] for r in measured])
            lines.append(
                f"| {int(size):,} | {label} | {_fmt(median(rates))} ({spread(rates)}) | {_fmt(mb_rate)} | "
                f"{_median_cell(vs_python)} |"
            )
    return [*lines, ""]


def _cuts_section(results: dict[str, Any]) -> list[str]:
    """The cuts toward the machine's limit (``--steps cuts``, `bench.cuts`), each beside the code
    before it."""
    cuts = results.get("cuts")
    if not cuts:
        return []
    lines = [
        "## Cuts toward the machine's limit (records/s, side by side)",
        "",
        "Each cut beside the code before it, in the same run, both sides back to back on the same records, "
        "every second round in the other order (`--steps cuts`, `bench/cuts.py`). Median of the rounds "
        "(min–max); the ratio is the median of the per-round ratios.",
        "",
        "| cut | measured on | before | after | after ÷ before |",
        "| --- | --- | --- | --- | --- |",
    ]
    for size in sorted(cuts, key=int):
        out = cuts[size]
        reads = out.get("read_task", [])
        if reads:
            records = reads[0]["records"]
            lines.append(
                _cut_row(
                    "a fetched batch at a time: its columns read from the client's messages, Arrow's "
                    "JSON reader where it agrees (was: a record object, a decoder call and a row tuple "
                    "per record)",
                    f"one read task's Python work, {records:,} records, in one process",
                    reads,
                    "record_by_record",
                    "batches",
                )
            )
        tasks = out.get("task_size", [])
        if tasks:
            small, large = sorted(
                int(key.removeprefix("tasks_")) for key in tasks[0] if key.startswith("tasks_")
            )
            lines.append(
                _cut_row(
                    f"read tasks of {large:,} offsets (was {small:,})",
                    f"the files pipeline end to end, {int(size):,} records in epochs of "
                    f"{results['meta']['batch_records']:,}",
                    tasks,
                    f"tasks_{small}",
                    f"tasks_{large}",
                )
            )
    return [*lines, ""]


def _profile_section(results: dict[str, Any]) -> list[str]:
    """Where the files pipeline's time goes (``--steps profile``, `bench.profile`)."""
    profiles = results.get("profile")
    if not profiles:
        return []
    lines = [
        "## Where the time goes (files pipeline, CPU by part)",
        "",
        "One run of the files pipeline with every process's CPU read from /proc (the runtime's Python "
        "workers followed through their daemon every 20 ms), then, where py-spy is installed, a second run "
        "with py-spy sampling the workers (`--steps profile`, `bench/profile.py`). µs per record is CPU "
        "time over the records; the share of the cores is CPU time over the run's wall time on all cores.",
        "",
    ]
    for size, out in sorted(profiles.items(), key=lambda kv: int(kv[0])):
        records, cores = out["records"], out["cores"]
        lines += [
            f"{int(size):,} records at {_fmt(out['records_per_s'])} records/s, {out['wall_s']:.1f} s on "
            f"{cores} cores ({out['runtime']}); {out['workers']} Python workers seen:",
            "",
            "| part | CPU s | µs per record | share of the cores |",
            "| --- | --- | --- | --- |",
        ]
        spent = sorted(out["cpu_s"].items(), key=lambda kv: -kv[1])
        for part, cpu in [*spent, ("all", sum(out["cpu_s"].values()))]:
            lines.append(
                f"| {part} | {cpu:.1f} | {cpu / records * 1e6:.2f} | {cpu / (out['wall_s'] * cores):.0%} |"
            )
        shares = out.get("worker_shares")
        if shares:
            workers_us = out["cpu_s"].get("python workers", 0.0) / records * 1e6
            lines += [
                "",
                "The Python workers' CPU by part (py-spy's samples; µs per record from their CPU above):",
                "",
                "| part of the workers | share of their samples | µs per record |",
                "| --- | --- | --- |",
            ]
            lines += [
                f"| {part} | {share:.1%} | {share * workers_us:.2f} |" for part, share in shares.items()
            ]
        lines.append("")
    return lines


def _cut_row(cut: str, where: str, rounds: list[dict[str, Any]], before: str, after: str) -> str:
    """One cut's row: each side's rate and the ratio within each round."""
    old = [r[before]["records_per_s"] for r in rounds]
    new = [r[after]["records_per_s"] for r in rounds]
    gain = [n / o for n, o in zip(new, old, strict=True)]
    return (
        f"| {cut} | {where} | {_fmt(median(old))} ({spread(old)}) | {_fmt(median(new))} ({spread(new)}) | "
        f"{median(gain):.2f}× ({spread(gain)}) |"
    )


# The Avro step's systems, in the order of its table; "files" and "spark_structured_streaming" read the
# JSON data set, the "_avro" ones the same records as Avro.
AVRO_SYSTEMS = {
    "files": "onceflow → Parquet, JSON",
    "files_avro": "onceflow → Parquet, Avro",
    "spark_structured_streaming": "Structured Streaming, from_json",
    "spark_structured_streaming_avro": "Structured Streaming, from_avro",
}
AVRO_RATIOS = {
    "avro_vs_json": "onceflow Avro ÷ JSON",
    "avro_vs_sss_avro": "onceflow Avro ÷ Structured Streaming from_avro",
    "json_vs_sss_json": "onceflow JSON ÷ Structured Streaming from_json",
    "sss_avro_vs_json": "Structured Streaming from_avro ÷ from_json",
}


def avro_ratios(round_: dict[str, Any]) -> dict[str, float]:
    """The Avro step's ratios within one round (nan where a system did not run)."""
    rate = {key: _rate(round_, key) for key in AVRO_SYSTEMS}
    return {
        "avro_vs_json": rate["files_avro"] / rate["files"],
        "avro_vs_sss_avro": rate["files_avro"] / rate["spark_structured_streaming_avro"],
        "json_vs_sss_json": rate["files"] / rate["spark_structured_streaming"],
        "sss_avro_vs_json": rate["spark_structured_streaming_avro"] / rate["spark_structured_streaming"],
    }


def avro_summary(entry: dict[str, Any]) -> str:
    """One round of the Avro step in one line, for the bench's log."""
    return _round_line(entry, AVRO_SYSTEMS, avro_ratios(entry))


def _round_line(entry: dict[str, Any], systems: dict[str, str], ratios: dict[str, float]) -> str:
    """A round's rates and the ratios it could take (not NaN), in one line."""
    parts = [f"{key} {entry[key]['records_per_s']:.0f}/s" for key in systems if key in entry]
    parts += [f"{key} {value:.2f}" for key, value in ratios.items() if value == value]
    return ", ".join(parts)


# The nested step's systems and ratios: "files" reads the flat JSON data set, the "_nested" ones the
# nested one (orders with their items), onceflow on each read path.
NESTED_SYSTEMS = {
    "files": "onceflow → Parquet, flat JSON",
    "files_nested": "onceflow → Parquet, nested (Python read)",
    "files_nested_jvm": "onceflow → Parquet, nested (JVM read)",
    "spark_structured_streaming": "Structured Streaming, flat from_json",
    "spark_structured_streaming_nested": "Structured Streaming, nested from_json",
}
NESTED_RATIOS = {
    "nested_vs_sss": "onceflow nested (Python read) ÷ Structured Streaming nested",
    "nested_jvm_vs_sss": "onceflow nested (JVM read) ÷ Structured Streaming nested",
    "nested_vs_flat": "onceflow nested ÷ flat (Python read)",
}


def nested_ratios(round_: dict[str, Any]) -> dict[str, float]:
    """The nested step's ratios of one round (NaN where a system did not run)."""
    rate = {key: _rate(round_, key) for key in NESTED_SYSTEMS}
    return {
        "nested_vs_sss": rate["files_nested"] / rate["spark_structured_streaming_nested"],
        "nested_jvm_vs_sss": rate["files_nested_jvm"] / rate["spark_structured_streaming_nested"],
        "nested_vs_flat": rate["files_nested"] / rate["files"],
    }


def nested_summary(entry: dict[str, Any]) -> str:
    """One round of the nested step in one line, for the bench's log."""
    return _round_line(entry, NESTED_SYSTEMS, nested_ratios(entry))


def _nested_section(results: dict[str, Any]) -> list[str]:
    intro = (
        "Two topics: the flat data set, and orders with five items and a context object each (same "
        "id, amount and customer; padded to the size below). In each round, back to back: the "
        "exactly-once files pipeline on the flat topic, on the nested one with the Python read path "
        "(the default) and with the JVM read path (`ONCEFLOW_JSON_READ=jvm`), writing the three "
        "columns and the items as they came; then Structured Streaming on each topic with `from_json` "
        "and the flat or nested `StructType`, writing the same columns. Ratios are taken within each "
        "round; the last row is the median."
    )

    def size_line(size: str, found: dict[str, Any], runtime: str) -> str:
        jvm = "files_nested_jvm" in found["rounds"][0]
        return (
            f"{int(size):,} records; a value is {found['json_value_bytes']:g} bytes flat, "
            f"{found['nested_value_bytes']:g} nested; onceflow runtime: {runtime}."
            + ("" if jvm else " The JVM read path was not run at this size (`--nested-jvm-sizes`).")
        )

    title = "## Nested JSON beside flat JSON (records/s, end to end)"
    nested = results.get("nested", {})
    lines = _ratio_section(nested, title, intro, size_line, NESTED_SYSTEMS, NESTED_RATIOS, nested_ratios)
    return lines + _nested_verdict(nested.get("10000000", {}).get("rounds", []))


def _nested_verdict(rounds: list[dict[str, Any]]) -> list[str]:
    """Whether the 10^7 rounds meet the nested JSON target, and where each system's time per record
    went: onceflow's slice jobs against its whole run, Structured Streaming's query against its whole
    spark-submit."""
    rounds = [r for r in rounds if "spark_structured_streaming_nested" in r]
    if not rounds:
        return []
    ratio = median(nested_ratios(r)["nested_vs_sss"] for r in rounds)
    verdict = "met" if ratio >= NESTED_VS_SSS else "missed"
    counted = "one round" if len(rounds) == 1 else f"median of {len(rounds)} rounds"

    def micros(run: dict[str, Any], seconds: float) -> float:
        return seconds / run["records"] * 1e6

    ours = [r["files_nested"] for r in rounds]
    theirs = [r["spark_structured_streaming_nested"] for r in rounds]
    ours_wall = median(micros(run, run["wall_s"]) for run in ours)
    ours_slices = median(micros(run, sum(e["spark_s"] for e in run["epochs"])) for run in ours)
    theirs_wall = median(micros(run, run["wall_s"]) for run in theirs)
    theirs_query = median(micros(run, run["processing_s"]) for run in theirs)
    return [
        f"**The target at 10^7 records (nested JSON, files sink, ≥ {NESTED_VS_SSS}× Structured Streaming "
        f"with the nested `StructType`) is {verdict}: {ratio:.2f}×** ({counted}). Time per record: "
        f"onceflow {ours_wall:.1f} µs end to end, of which "
        f"{ours_slices:.1f} µs in its slice jobs (the Python workers' read, typed parse and Arrow "
        f"batches, the transform and the staged Parquet); Structured Streaming {theirs_wall:.1f} µs end "
        f"to end, of which {theirs_query:.1f} µs in its query (the rest is spark-submit's start-up and "
        "the final count)." + ("" if verdict == "met" else " " + NESTED_PROFILE),
        "",
    ]


# What a profile of the nested JSON pipeline found (one epoch of 10^6 nested records on the warm runtime,
# `python -m bench.spark_jobs --records 1000000 --nested`, its Python workers sampled by py-spy at 50 Hz;
# the decode alone timed in one process over 2·10^5 records).
NESTED_PROFILE = (
    "Where onceflow's time goes, from a profile of one 10^6-record nested epoch on the warm runtime "
    "(`python -m bench.spark_jobs --records 1000000 --nested`, the Python workers sampled by py-spy "
    "at 50 Hz): one Spark job of one stage, no shuffle; the executors' JVMs spent 3.6 CPU seconds, "
    "the Python workers about 30 s of samples, of which the typed parse of the nested JSON took 37 %, "
    "building the Arrow columns from the Python rows (the items a list of structs made of dicts) 27 %, "
    "the Kafka reads 12 % and the Parquet writes 13 %. The parse alone costs 3.6 µs per nested record "
    "on one core, against 0.9 µs per flat one. Structured Streaming, whose spark-submit start-up weighs "
    "on it at 10^6 records, reads the nested topic about twice as fast per record at 10^7; onceflow's "
    "per-record cost stays where it was. The profile points at the Python row path: decoding nested "
    "records straight into Arrow columns, without a Python row per record, is what would close the gap."
)


# The nested Avro step's systems and ratio: the nested step's orders as Avro (registry wire format).
NESTED_AVRO_SYSTEMS = {
    "files_nested_avro": "onceflow → Parquet, nested Avro (Python read)",
    "spark_structured_streaming_nested_avro": "Structured Streaming, nested from_avro",
}
NESTED_AVRO_RATIOS = {"nested_avro_vs_sss": "onceflow ÷ Structured Streaming (nested Avro)"}


def nested_avro_ratios(round_: dict[str, Any]) -> dict[str, float]:
    """The nested Avro step's ratio of one round (NaN where Structured Streaming did not run)."""
    return {
        "nested_avro_vs_sss": _rate(round_, "files_nested_avro")
        / _rate(round_, "spark_structured_streaming_nested_avro")
    }


def nested_avro_summary(entry: dict[str, Any]) -> str:
    """One round of the nested Avro step in one line, for the bench's log."""
    return _round_line(entry, NESTED_AVRO_SYSTEMS, nested_avro_ratios(entry))


def _nested_avro_section(results: dict[str, Any]) -> list[str]:
    intro = (
        "The nested orders above (the same fields and values, five items and a context object each) as "
        "Avro in the schema registry wire format, with the schema registered in the registry named "
        "below. In each round, back to back: the exactly-once files pipeline, which decodes nested Avro "
        "in its Python workers (on either read path), writing the three columns and the items as they "
        "came; then Structured Streaming cutting off the 5-byte header and reading the body with "
        "spark-avro's `from_avro` and the nested schema, writing the same columns. Ratios are taken "
        "within each round; the last row is the median."
    )

    def size_line(size: str, found: dict[str, Any], runtime: str) -> str:
        return (
            f"{int(size):,} records; a value is {found['avro_value_bytes']:.1f} bytes; schema in "
            f"{found['registry']}; onceflow runtime: {runtime}."
        )

    title = "## Nested Avro (records/s, end to end)"
    by_size = results.get("nested_avro", {})
    lines = _ratio_section(
        by_size, title, intro, size_line, NESTED_AVRO_SYSTEMS, NESTED_AVRO_RATIOS, nested_avro_ratios
    )
    rounds = [r for r in by_size.get("10000000", {}).get("rounds", []) if "files_nested_avro" in r]
    values = [q for q in (nested_avro_ratios(r)["nested_avro_vs_sss"] for r in rounds) if not math.isnan(q)]
    if values:
        lines += [
            f"At 10^7 records onceflow reads nested Avro at {median(values):.2f}× Structured Streaming's "
            "`from_avro` (the 1.2× target is set for nested JSON only). The Python workers decode each "
            "record with fastavro, 12 µs per nested record on one core (6 µs per flat one), against "
            "3.6 µs for the nested JSON's typed parse, while spark-avro decodes in the JVM.",
            "",
        ]
    return lines


# The Delta step's systems and ratios: the same pipeline into each table format (and files), and
# Structured Streaming's own Delta sink, all on the same topic.
DELTA_SYSTEMS = {
    "files": "onceflow → Parquet files",
    "iceberg": "onceflow → Iceberg",
    "delta": "onceflow → Delta",
    "spark_structured_streaming_delta": 'Structured Streaming → Delta (format("delta"))',
}
DELTA_RATIOS = {
    "delta_vs_sss_delta": "onceflow Delta ÷ Structured Streaming Delta",
    "delta_vs_files": "onceflow Delta ÷ files",
    "delta_vs_iceberg": "onceflow Delta ÷ Iceberg",
}
# The Delta target: the Delta pipeline ÷ Structured Streaming's Delta sink at 10^7 records; and the Delta
# commit stays flat: at 10^7 rows at most DELTA_COMMIT_S, and at most DELTA_COMMIT_GROWTH_S more than
# the smallest epoch measured.
DELTA_VS_SSS = 1.2
DELTA_COMMIT_S = 1.0
DELTA_COMMIT_GROWTH_S = 0.25


def delta_ratios(round_: dict[str, Any]) -> dict[str, float]:
    """The Delta step's ratios of one round (NaN where a system did not run)."""
    rate = {key: _rate(round_, key) for key in DELTA_SYSTEMS}
    return {
        "delta_vs_sss_delta": rate["delta"] / rate["spark_structured_streaming_delta"],
        "delta_vs_files": rate["delta"] / rate["files"],
        "delta_vs_iceberg": rate["delta"] / rate["iceberg"],
    }


def delta_summary(entry: dict[str, Any]) -> str:
    """One round of the Delta step in one line, for the bench's log."""
    return _round_line(entry, DELTA_SYSTEMS, delta_ratios(entry))


def _delta_vs_sss(rounds: list[dict[str, Any]]) -> list[float]:
    """The rounds' Delta ÷ Structured Streaming Delta ratios, where both ran."""
    return [q for q in (delta_ratios(r)["delta_vs_sss_delta"] for r in rounds) if not math.isnan(q)]


def _delta_commit(results: dict[str, Any]) -> tuple[str, str, str] | None:
    """The (target, measured, verdict) row of the Delta commit's flatness, once it was measured."""
    return _flat_commit(results, "delta", "delta commit", DELTA_COMMIT_S, DELTA_COMMIT_GROWTH_S)


def _flat_commit(
    results: dict[str, Any], kind: str, what: str, at_most_s: float, growth_s: float
) -> tuple[str, str, str] | None:
    """The (target, measured, verdict) row of a commit's flatness against epoch size: at 10^7 rows at
    most ``at_most_s``, and at most ``growth_s`` more than at the smallest epoch; None until measured."""
    by_size = results.get("commit_cost", {}).get(kind, {})
    if not by_size:
        return None
    smallest, largest = min(by_size, key=int), max(by_size, key=int)
    low, high = median(by_size[smallest]), median(by_size[largest])
    target = (
        f"{what} flat up to 10^7 rows: ≤ {at_most_s:g} s at 10^7, at most "
        f"{growth_s:g} s more than at the smallest epoch"
    )
    measured = f"{high:.3f} s at {int(largest):,} rows, {low:.3f} s at {int(smallest):,}"
    if largest != "10000000":
        return target, f"{measured} (10^7 not run)", "not measured at 10^7"
    flat = high <= at_most_s and high - low <= growth_s
    return target, measured, "met" if flat else "MISSED"


def _delta_targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The Delta throughput target's row once the Delta step ran with Structured Streaming (at 10^7, or
    at its largest size, said so), and the Delta commit's."""
    rows = []
    measured = {
        size: values
        for size, found in results.get("delta", {}).items()
        if (values := _delta_vs_sss(found["rounds"]))
    }
    target = f"Delta pipeline ≥ {DELTA_VS_SSS}× Structured Streaming's Delta sink at 10^7 records"
    if "10000000" in measured:
        rows.append(_at_least(target, measured["10000000"], DELTA_VS_SSS))
    elif measured:
        largest = max(measured, key=int)
        m = median(measured[largest])
        rows.append((target, f"{m:.3f}× at {int(largest):,} (10^7 not run)", "not measured at 10^7"))
    commit = _delta_commit(results)
    return rows + ([commit] if commit else [])


def _delta_section(results: dict[str, Any]) -> list[str]:
    intro = (
        "One topic of the data set; in each round, back to back and in alternating order (every second "
        "round reversed): the exactly-once pipeline into Parquet files, into an Iceberg table and into a "
        "Delta table (Parquet files staged per task attempt, one Delta commit per epoch with a `txn` "
        'action), then Structured Streaming with its own Delta sink (`writeStream.format("delta")`, '
        "availableNow, a Delta commit per micro-batch of the same size as onceflow's epochs, delta-spark "
        "4.1 through spark-submit `local[2]`). Every run's output rows are counted against the records "
        "kept by the filter. Ratios are taken within each round; the last row is the median."
    )

    def size_line(size: str, found: dict[str, Any], runtime: str) -> str:
        return f"{int(size):,} records of {found['record_bytes']:g} bytes; onceflow runtime: {runtime}."

    title = "## Delta beside files, Iceberg and Structured Streaming's Delta sink (records/s, end to end)"
    by_size = results.get("delta", {})
    lines = _ratio_section(by_size, title, intro, size_line, DELTA_SYSTEMS, DELTA_RATIOS, delta_ratios)
    if not lines:
        return []
    for size, found in sorted(by_size.items(), key=lambda item: int(item[0])):
        values = _delta_vs_sss(found["rounds"])
        if not values:
            continue
        m = median(values)
        verdict = (
            f"target ≥ {DELTA_VS_SSS}×: {'met' if m >= DELTA_VS_SSS else 'missed'}"
            if size == "10000000"
            else f"the target (≥ {DELTA_VS_SSS}×) is set at 10^7"
        )
        lines.append(
            f"- {_power(size)} records: onceflow Delta ÷ Structured Streaming Delta {m:.2f} "
            f"({spread(values)}); {verdict}."
        )
    lines += ["", *_delta_commit_lines(results)]
    return lines


def _delta_commit_lines(results: dict[str, Any]) -> list[str]:
    """The Delta commit's time against epoch size, and whether it stayed flat."""
    by_size = results.get("commit_cost", {}).get("delta", {})
    if not by_size:
        return []
    sizes = sorted(by_size, key=int)
    row = _delta_commit(results)
    assert row is not None
    return [
        "Delta commit time against epoch size (s): one epoch staged by 4 writers, then committed (one "
        "Delta commit of every staged file's add action and the `txn` action); only the commit is timed.",
        "",
        "| rows | " + " | ".join(f"{int(s):,}" for s in sizes) + " | flat up to 10^7 |",
        "| --- |" + " --- |" * (len(sizes) + 1),
        "| delta commit s | "
        + " | ".join(f"{_fmt(median(by_size[s]))} ({spread(by_size[s])})" for s in sizes)
        + f" | {row[2]} |",
        "",
    ]


# The s3 step's systems and ratios: the files and Iceberg pipelines with their output on the local disk
# and in the stack's bucket, and Structured Streaming's Parquet file sink into the bucket (S3A), all on
# the same topic.
S3_SYSTEMS = {
    "files": "files local",
    "files_s3": "files S3",
    "iceberg": "Iceberg local",
    "iceberg_s3": "Iceberg S3",
    "spark_structured_streaming_s3": "SS Parquet S3",
}
S3_RATIOS = {
    "files_s3_vs_sss_s3": "files S3 ÷ SS S3",
    "files_s3_vs_files": "files S3 ÷ files local",
    "iceberg_s3_vs_iceberg": "Iceberg S3 ÷ Iceberg local",
}
# The files commit in a bucket stays flat, as the Delta commit does: a log entry naming the staged
# objects, whatever their size.
S3_COMMIT_S = DELTA_COMMIT_S
S3_COMMIT_GROWTH_S = DELTA_COMMIT_GROWTH_S


def s3_ratios(round_: dict[str, Any]) -> dict[str, float]:
    """The s3 step's ratios of one round (NaN where a system did not run)."""
    rate = {key: _rate(round_, key) for key in S3_SYSTEMS}
    return {
        "files_s3_vs_sss_s3": rate["files_s3"] / rate["spark_structured_streaming_s3"],
        "files_s3_vs_files": rate["files_s3"] / rate["files"],
        "iceberg_s3_vs_iceberg": rate["iceberg_s3"] / rate["iceberg"],
    }


def s3_summary(entry: dict[str, Any]) -> str:
    """One round of the s3 step in one line, for the bench's log."""
    return _round_line(entry, S3_SYSTEMS, s3_ratios(entry))


def _s3_commit(results: dict[str, Any]) -> tuple[str, str, str] | None:
    return _flat_commit(results, "files_s3", "files commit in a bucket", S3_COMMIT_S, S3_COMMIT_GROWTH_S)


def _s3_section(results: dict[str, Any]) -> list[str]:
    """One row per size: each system's records/s and the ratios, median of the rounds (min–max); then
    the files commit in the bucket against epoch size."""
    by_size = results.get("s3", {})
    if not by_size:
        return []
    lines = [
        "## Object storage: files and Iceberg in an S3 bucket beside the local disk (records/s, end to end)",
        "",
        "One topic of the data set; in each round, back to back and in alternating order (every second "
        "round reversed): the exactly-once pipeline into Parquet files with its root on the local disk "
        "and in the stack's S3 bucket, into Iceberg with its warehouse on the local disk and in the "
        "bucket (both catalogs pyiceberg's SQL catalog in SQLite), then Structured Streaming's own "
        'Parquet file sink (`writeStream.format("parquet")`, committed by its `_spark_metadata` log; '
        "availableNow, micro-batches of the same size as onceflow's epochs, spark-submit `local[2]`) "
        "into the bucket through Hadoop's S3A connector, its checkpoint on the local disk as onceflow's "
        "ledger is. The bucket is the stack's local S3 server (`infra/s3.sh`), so these figures measure "
        "the protocol's requests and copies, not a network's latency. Every run's output rows are read "
        "back (through the bucket for the S3 runs) and counted against the records kept by the filter. "
        "Median of the rounds (min–max); ratios are taken within each round.",
        "",
    ]
    header = ["records", *S3_SYSTEMS.values(), *S3_RATIOS.values()]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for size, found in sorted(by_size.items(), key=lambda item: int(item[0])):
        rounds = found["rounds"]
        if not rounds:
            continue
        cells = [f"{int(size):,} ({len(rounds)} round{'s' if len(rounds) > 1 else ''})"]
        for key in S3_SYSTEMS:
            rates = [r[key]["records_per_s"] for r in rounds if key in r]
            cells.append(f"{_fmt(median(rates))} ({spread(rates)})" if rates else "")
        for key in S3_RATIOS:
            values = [q for q in (s3_ratios(r)[key] for r in rounds) if not math.isnan(q)]
            cells.append(f"{median(values):.2f} ({spread(values)})" if values else "")
        lines.append("| " + " | ".join(cells) + " |")
    runtime = next(iter(by_size.values()))["rounds"][0].get("runtime", "spark-submit, one per slice")
    lines += ["", f"onceflow runtime: {runtime}.", ""]
    cost = results.get("commit_cost", {}).get("files_s3", {})
    row = _s3_commit(results)
    if cost and row is not None:
        sizes = sorted(cost, key=int)
        lines += [
            "Files commit in the bucket against epoch size (s): one epoch written by 4 writers straight "
            "to their objects in the table, then committed (each object's size checked, the commit "
            "log's entry put create-only, the attempts' markers deleted; no object is copied); only the "
            "commit is timed.",
            "",
            "| rows | " + " | ".join(f"{int(s):,}" for s in sizes) + " | flat up to 10^7 |",
            "| --- |" + " --- |" * (len(sizes) + 1),
            "| files S3 commit s | "
            + " | ".join(f"{_fmt(median(cost[s]))} ({spread(cost[s])})" for s in sizes)
            + f" | {row[2]} |",
            "",
        ]
    return lines


def _avro_section(results: dict[str, Any]) -> list[str]:
    intro = (
        "The same records (the same fields and values, the JSON's padding note included) in two topics: "
        "as JSON, and as Avro in the schema registry wire format (magic byte, 4-byte schema id, body) "
        "with the schema registered in the registry named below. In each round, back to back: the "
        "exactly-once files pipeline on each topic (its format the only difference), then Structured "
        "Streaming on each, the Avro one cutting off the 5-byte header and reading the body with "
        "spark-avro's `from_avro`. Ratios are taken within each round; the last row is the median. "
        "onceflow read both on its JVM path (before JSON's default became the Python reader): Spark's "
        "Kafka source with `from_json`, or with `from_avro` "
        "and the writer schemas of the topic's subject (`<topic>-value`, where the schema is "
        "registered); each slice's log line names the path it took."
    )

    def size_line(size: str, found: dict[str, Any], runtime: str) -> str:
        return (
            f"{int(size):,} records; a value is {found['json_value_bytes']:g} bytes as JSON, "
            f"{found['avro_value_bytes']:.1f} as Avro; schema in {found['registry']}; onceflow runtime: "
            f"{runtime}."
        )

    title = "## Avro beside JSON (records/s, end to end)"
    return _ratio_section(
        results.get("avro", {}), title, intro, size_line, AVRO_SYSTEMS, AVRO_RATIOS, avro_ratios
    )


def _ratio_section(
    by_size: dict[str, Any],
    title: str,
    intro: str,
    size_line: Callable[[str, dict[str, Any], str], str],
    systems_named: dict[str, str],
    ratios_named: dict[str, str],
    ratios: Callable[[dict[str, Any]], dict[str, float]],
) -> list[str]:
    """A step measured in rounds of several systems: per size, a row per round with each system's rate
    and the round's ratios, then the medians; a system or ratio no round has is left out."""
    if not by_size:
        return []
    lines = [title, "", intro, ""]
    for size, found in sorted(by_size.items(), key=lambda item: int(item[0])):
        rounds = found["rounds"]
        if not rounds:
            continue
        systems = [key for key in systems_named if key in rounds[0]]
        shown = [key for key in ratios_named if any(ratios(r)[key] == ratios(r)[key] for r in rounds)]
        lines += [
            size_line(size, found, rounds[0].get("runtime", "spark-submit, one per slice")),
            "",
            "| round | load average before | "
            + " | ".join(systems_named[k] for k in systems)
            + " | "
            + " | ".join(ratios_named[k] for k in shown)
            + " |",
            "| --- | --- | " + " | ".join("---" for _ in (*systems, *shown)) + " |",
        ]
        for n, r in enumerate(rounds, 1):
            ratio = ratios(r)
            lines.append(
                f"| {n} | {r['load_before'][0]:.2f} | "
                + " | ".join(_fmt(r[k]["records_per_s"]) for k in systems)
                + " | "
                + " | ".join(f"{ratio[k]:.2f}" for k in shown)
                + " |"
            )
        rates = {k: [r[k]["records_per_s"] for r in rounds] for k in systems}
        ratio_values = {k: [ratios(r)[k] for r in rounds] for k in shown}
        lines.append(
            "| median | | "
            + " | ".join(f"{_fmt(median(v))} ({spread(v)})" for v in rates.values())
            + " | "
            + " | ".join(f"{median(v):.2f} ({spread(v)})" for v in ratio_values.values())
            + " |"
        )
        lines.append("")
    return lines


def _commit_section(results: dict[str, Any]) -> list[str]:
    cost = results.get("commit_cost", {})
    if not cost:
        return []
    sizes = sorted({s for by in cost.values() for s in by}, key=int)
    lines = [
        "## Commit time against epoch size (s)",
        "",
        "One epoch staged by 4 writers (one per partition), then committed by the sink's committer as the "
        "coordinator does; only the commit is timed.",
        "",
        "| sink | " + " | ".join(f"{int(s):,} rows" for s in sizes) + " |",
        "| --- |" + " --- |" * len(sizes),
    ]
    for kind, by_size in cost.items():
        cells = [f"{_fmt(median(by_size[s]))} ({spread(by_size[s])})" if s in by_size else "" for s in sizes]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _protocol_section(results: dict[str, Any]) -> list[str]:
    protocol = results.get("sink_protocol", {})
    if not protocol:
        return []
    lines = [
        "## Exactly-once against at-least-once in the sink alone",
        "",
        "The same rows written by 4 writers, pre-committed and committed, without Spark: `plain` "
        "(at-least-once, COPY, visible at once) then `postgres_2pc` (exactly-once: COPY in a prepared "
        "transaction with a marker row, then COMMIT PREPARED), back to back in each round. Seconds for the "
        "whole epoch; the ratio is at-least-once time ÷ exactly-once time, i.e. exactly-once throughput "
        "as a fraction of at-least-once. `plain` commits every `batch_size` rows (default 1,000), each "
        "commit a WAL flush, while the two-phase sink flushes once per task at PREPARE: that is why the "
        "exactly-once sink is the faster one here.",
        "",
        "| rows | at-least-once s | exactly-once s | exactly-once ÷ at-least-once throughput |",
        "| --- | --- | --- | --- |",
    ]
    for size in sorted(protocol, key=int):
        rounds = protocol[size]
        alo = [r["plain_s"] for r in rounds]
        eo = [r["postgres_2pc_s"] for r in rounds]
        ratio = [r["plain_s"] / r["postgres_2pc_s"] for r in rounds]
        lines.append(
            f"| {int(size):,} | {_fmt(median(alo))} ({spread(alo)}) | {_fmt(median(eo))} ({spread(eo)}) | "
            f"{median(ratio):.3f} ({spread(ratio)}) |"
        )
    return [*lines, ""]


def _overhead_section(results: dict[str, Any]) -> list[str]:
    overhead = results.get("overhead")
    if not overhead:
        return []
    backends = list(overhead["ledgers"])
    steps = {b: epoch_steps(results, b) for b in backends}
    lines = [
        f"## Fixed cost of an epoch by step (s, epochs of {overhead['records_per_epoch']:,} records)",
        "",
        "Start-up is a spark-submit of a job that only starts and stops a SparkSession (median of "
        f"{len(results.get('spark_startup_s', []))}); processing is the slice's spark-submit minus it. "
        "Coordination = recover + plan + decision.",
        "",
        "| step | " + " | ".join(f"{b} ledger" for b in backends) + " |",
        "| --- |" + " --- |" * len(backends),
    ]
    for step in (*STEPS, "coordination_s"):
        label = STEP_LABELS.get(step, "coordination")
        lines.append(
            f"| {label} | "
            + " | ".join(f"{_fmt(median(steps[b][step]))} ({spread(steps[b][step])})" for b in backends)
            + " |"
        )
    return [*lines, ""]


def _latency_epochs(epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each epoch with its plan → commit total; the first is left out when there are several (it opens
    the session and ships the pipeline's modules, which later epochs reuse)."""
    steps = ("plan_s", "spark_s", "decide_s", "commit_s")
    out = [{**e, "total_s": sum(e[k] for k in steps)} for e in epochs]
    return out[1:] if len(out) > 1 else out


def _latency_section(results: dict[str, Any]) -> list[str]:
    latency = results.get("latency")
    if not latency:
        return []
    runtimes = [r for r in ("connect", "submit") if latency.get(r)]
    labels = {"connect": f"warm runtime ({latency.get('remote')})", "submit": "spark-submit per slice"}
    lines = [
        f"## Latency of an epoch of {latency['records_per_epoch']:,} records (s, plan → commit)",
        "",
        "Epochs into Parquet files one after another, on each runtime in turn, in one run; the median "
        "(min–max) of the epochs after the first (the first opens the session). Process is every slice "
        "of the epoch; decide is the ledger's decision; commit the sink's.",
        "",
        "| runtime | plan | process | decide | commit | total |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for runtime in runtimes:
        epochs = _latency_epochs(latency[runtime])

        def cell(key: str, epochs: list[dict[str, Any]] = epochs) -> str:
            values = [e[key] for e in epochs]
            return f"{_fmt(median(values))} ({spread(values)})"

        lines.append(
            f"| {labels[runtime]} | {cell('plan_s')} | {cell('spark_s')} | {cell('decide_s')} | "
            f"{cell('commit_s')} | {cell('total_s')} |"
        )
    idle = latency.get("idle_runtime")
    if idle:
        if idle.get("memory_measure") == "pss":
            held = "(PSS, every runtime process: master, workers, Connect server, executors)"
        else:
            held = "resident (the Connect server and the executors; not the master and workers)"
        lines += [
            "",
            f"The warm runtime while idle holds {idle['total_mb']:.0f} MB {held}: {idle['jvm_mb']:.0f} MB "
            f"of JVMs and {idle['python_workers_mb']:.0f} MB of idle Python workers.",
        ]
    return [*lines, ""]


def _follow_section(results: dict[str, Any]) -> list[str]:
    follow = results.get("follow")
    if not follow:
        return []
    fresh, epochs = follow["freshness_s"], follow["epoch_s"]
    lines = [
        f"## Freshness through `onceflow run --follow` ({follow['records_per_batch']:,}-record batches)",
        "",
        f"One follower on the warm runtime (files sink, looking for records every {follow['poll_s']} s); "
        f"{follow['batches']} batches produced a few seconds apart, after one that opens the session. "
        "Freshness is from the producer's flush to the ledger showing the epoch that read the batch "
        "COMMITTED (the files sink's rows are then visible); an epoch is plan → commit.",
        "",
        "| | median | min–max | target |",
        "| --- | --- | --- | --- |",
        f"| freshness (s) | {_fmt(median(fresh))} | {spread(fresh)} | — |",
    ]
    if epochs:
        met = "met" if median(epochs) <= 1.0 else "**missed**"
        lines.append(f"| epoch (s) | {_fmt(median(epochs))} | {spread(epochs)} | ≤ 1 s: {met} |")
    for step, seconds in (follow.get("step_median_s") or {}).items():
        lines.append(f"| {step} (s, median) | {_fmt(seconds)} | | |")
    return [*lines, ""]


def _where_the_time_goes(results: dict[str, Any]) -> list[str]:
    """The profile of a one-pass epoch, from the jobs step's CPU seconds, when it ran."""
    runs = [r for size, rs in results.get("spark_jobs", {}).items() for r in rs if r.get("cpu_seconds")]
    if not runs:
        return []
    largest = max(r["records"] for r in runs)
    runs = [r for r in runs if r["records"] == largest]
    cpu = {role: median(r["cpu_seconds"].get(role, 0.0) for r in runs) for role in runs[0]["cpu_seconds"]}
    epoch = median(r["epoch_seconds"] for r in runs)
    busiest = sorted(cpu.items(), key=lambda item: -item[1])
    return [
        f"- **Where a one-pass epoch's time goes ({largest:,} records, the jobs step).** One Spark job of "
        f"one stage, no shuffle, {median(r['tasks'] for r in runs):g} tasks; the epoch took "
        f"{epoch:.1f} s (median), in which 2 cores could spend {2 * epoch:.0f} CPU seconds: "
        + ", ".join(f"{role} {seconds:.1f}" for role, seconds in busiest)
        + ". The Python workers read, decode and build Arrow batches, and write the Parquet files; the "
        "executors' JVMs convert the batches to rows and back around the filter and projection. Workers "
        "that exit with their task (`spark.python.worker.reuse false`) are counted only as far as their "
        "daemon has reaped them by the second look, so their share here is low; `bench.spark_jobs` with "
        "workers reused measured 8.4-8.6 s. Thread "
        "dumps of the executors taken during such an epoch found a third of the busy task threads in "
        "Spark 4's per-row sizing of Arrow batches (`ArrowWriter.sizeInBytes`); slices now turn it off "
        "(`spark.sql.execution.arrow.maxBytesPerBatch` at Int.MaxValue, batches bounded by rows as in "
        "Spark 3), and the rest is spread over the Kafka fetches, the JSON parser and the projections."
    ]


def _airflow_section(results: dict[str, Any]) -> list[str]:
    route = results.get("airflow_route")
    if not route:
        return []
    committed = route["queued_to_committed_s"]
    lines = [
        f"## An epoch through a real Airflow scheduler ({route['records_per_run']:,}-record runs)",
        "",
        f"Airflow's api-server, scheduler and DAG processor ({route['executor']}), the process task on the "
        f"warm runtime; {route['runs']} triggered runs after one that opens the session. Queued → "
        f"committed: median {_fmt(median(committed))} s ({spread(committed)}). Per task, the wait "
        "(from the previous task's end, or the run's queueing, to the task's start) and the run (start to "
        "end, which includes the task process's start-up and its parse of the DAG file; a fresh "
        f"interpreter parses it in {_fmt(median(route['dag_parse_s']))} s).",
        "",
        "| task | wait s (median) | run s (median) |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {task} | {_fmt(t['wait_median_s'])} | {_fmt(t['run_median_s'])} |"
        for task, t in route["per_task"].items()
    ]
    return [*lines, ""]


def _jobs_section(results: dict[str, Any]) -> list[str]:
    jobs = results.get("spark_jobs")
    if not jobs:
        return []
    lines = [
        "## What an epoch costs Spark (files pipeline, warm runtime)",
        "",
        "From the Connect server's REST API, the jobs tagged with the epoch's slices: each run is one epoch "
        "of the whole data set (decode, filter, projection, the files sink's staging). One run per row.",
        "",
        "| records | slices | jobs | stages | tasks | shuffle read B | shuffle written B | job s | epoch s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size, runs in sorted(jobs.items(), key=lambda item: int(item[0])):
        lines += [
            f"| {int(size):,} | {r['slices']} | {r['jobs']} | {r['stages']} | {r['tasks']} | "
            f"{r['shuffle_read_bytes']:,} | {r['shuffle_write_bytes']:,} | "
            f"{', '.join(f'{j:g}' for j in r['job_seconds'])} | {r['epoch_seconds']:g} |"
            for r in runs
        ]
    cpu = [r["cpu_seconds"] for runs in jobs.values() for r in runs if r.get("cpu_seconds")]
    if cpu:
        roles = sorted({role for c in cpu for role in c}, key=lambda role: -max(c.get(role, 0) for c in cpu))
        lines += [
            "",
            "CPU seconds each part of the machine spent during those epochs (user + system, from /proc; "
            "2 cores, so an epoch of E s has at most 2E to spend):",
            "",
            "| records | epoch s | " + " | ".join(roles) + " |",
            "| --- | --- | " + " | ".join("---" for _ in roles) + " |",
        ]
        for size, runs in sorted(jobs.items(), key=lambda item: int(item[0])):
            lines += [
                f"| {int(size):,} | {r['epoch_seconds']:g} | "
                + " | ".join(f"{r['cpu_seconds'].get(role, 0):g}" for role in roles)
                + " |"
                for r in runs
                if r.get("cpu_seconds")
            ]
    return [*lines, ""]


def _memory_section(results: dict[str, Any]) -> list[str]:
    tp = results.get("throughput", {})
    lines = [
        "## Peak memory (MB)",
        "",
        "Proportional set size (PSS: a page shared by several processes is split between them), sampled "
        "every 0.25 s; rows marked RSS were measured earlier as resident size, which counts the pages a "
        "forked Python worker shares with its daemon once per worker. Through spark-submit, over its "
        "process tree (the JVM is the driver and, in local mode, the executors); on the warm runtime, over "
        "every runtime process (master, workers, Connect server, executors, or on a lean runtime the Connect "
        "server alone) and the slice's driver (the bench process). JVMs, the executors' Python workers "
        "and the driver's Python process; the peak of their sum. Runtime: "
        f"{results.get('memory_bounded', {}).get('runtime', 'spark-submit')} (the bounded-batch row).",
        "",
        "| run | epoch records | total | JVM | Python workers | driver Python |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for size in _sizes(results):
        epochs = [e for r in tp[size] if "files" in r for e in r["files"]["epochs"]]
        if not epochs:
            continue
        lines.append(_memory_row(f"files pipeline, {int(size):,}-record topic", epochs))
    bounded = results.get("memory_bounded")
    if bounded:
        lines.append(
            _memory_row(
                f"files pipeline, {bounded['topic_records']:,}-record topic, "
                f"batch {bounded['batch_records']:,}",
                bounded["epochs"],
            )
        )
    return [*lines, ""]


def _runtime_memory_section(results: dict[str, Any]) -> list[str]:
    run = results.get("runtime_memory")
    if not run:
        return []

    def row(label: str, at: dict[str, Any]) -> str:
        return (
            f"| {label} | {at['total_mb']:.0f} | {at['jvm_mb']:.0f} | {at['python_mb']:.0f} | "
            f"{at['python_processes']} ({at['python_daemons']}) | {at['sessions']} |"
        )

    peak = run["peak"]
    lines = [
        f"## The warm runtime over {run['pipelines']} distinct pipelines ({run['epochs']} epochs)",
        "",
        f"Epochs of {run['records_per_epoch']:,} records into Parquet files, one distinct pipeline after "
        "another (each its own Spark Connect session); the proportional set size of every runtime process "
        f"(Connect server, executors and their Python processes, master and workers) every "
        f"{run['interval_s']:g} s; the end is {run['end']['settled_s']:.0f} s after the last epoch. First "
        f"epoch of a pipeline {run['first_epoch_median_s']} s median, later ones "
        f"{run['later_epoch_median_s']} s; {run['wall_s'] / 60:.1f} minutes in all.",
        "",
        "| when | total MB | JVMs MB | Python MB | Python processes (daemons) | sessions |",
        "| --- | --- | --- | --- | --- | --- |",
        row("at rest, before", run["start"]),
        row(f"peak (after {peak['pipelines']} pipelines, {peak['epochs']} epochs)", peak),
        row("at rest, after", run["end"]),
        "",
    ]
    for name, label in (
        ("total_mb", "total MB"),
        ("python_processes", "Python processes"),
        ("pace_s", "seconds per pipeline (median of each tenth of the run)"),
    ):
        if name in run:
            g = run[name]
            lines.append(
                f"- {label}: second half's peak {g['second_half_peak']:.0f} against the first half's "
                f"{g['first_half_peak']:.0f} (flat up to {g['limit']:.0f}): {'flat' if g['flat'] else 'GREW'}"
            )
    lines.append(_collector_line(run.get("gc")))
    verdict = "met" if run["peak_within_target"] else "missed"
    lines.append(
        f"- peak {peak['total_mb']:.0f} MB against the target of {run['target_mb']:.0f} MB: {verdict}"
    )
    return [*lines, ""]


def _collector_line(gc: dict[str, Any] | None) -> str:
    if gc is None:
        return "- garbage collection: not measured (no `jstat`, or a run from before it was read)"
    within = "within" if gc["flat"] else "OVER"
    return (
        f"- garbage collection: {gc['gc_s']:.0f} s of the run ({gc['share']:.0%}; {within} "
        f"{gc['limit']:.0%}), {gc['full_gcs']} full collections, old generation "
        f"{gc['old_used_after']:.0%} of {gc['old_capacity_mb']:.0f} MB full at the end"
    )


def _memory_row(label: str, epochs: list[dict[str, Any]]) -> str:
    def cell(key: str) -> str:
        values = [e[key] for e in epochs]
        return f"{median(values):.0f} ({spread(values)})"

    size = median(e["records"] for e in epochs)
    if any(e.get("memory_measure") != "pss" for e in epochs):
        label += " (RSS)"
    return (
        f"| {label} | {size:,.0f} | {cell('peak_total_mb')} | {cell('peak_jvm_mb')} | "
        f"{cell('peak_python_workers_mb')} | {cell('peak_driver_python_mb')} |"
    )


def _legend(ax: Any, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:  # a smoke run has nothing to plot in some panels
        ax.legend(fontsize=size)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    tp = results.get("throughput", {})
    sizes = _sizes(results)
    ax = axes[0][0]
    names = {"machine_limit": "the machine's limit", "limit": "one Python consumer", **CONFIG_LABELS}
    for key, name in names.items():
        xs = [int(s) for s in sizes if key in tp[s][0]]
        ys = [median(r[key]["records_per_s"] for r in tp[str(x)]) for x in xs]
        if xs:
            ax.plot(xs, ys, marker="o", label=name, linestyle="--" if key == "machine_limit" else "-")
    ax.set(xscale="log", yscale="log", xlabel="records", ylabel="records/s", title="Throughput, end to end")
    _legend(ax, 7)
    ax = axes[0][1]
    for kind, by_size in results.get("commit_cost", {}).items():
        xs = sorted(by_size, key=int)
        ax.plot([int(x) for x in xs], [median(by_size[x]) for x in xs], marker="o", label=kind)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set(xscale="log", yscale="log", xlabel="rows per epoch", ylabel="s", title="Commit time")
    _legend(ax, 8)
    ax = axes[1][0]
    overhead = results.get("overhead")
    if overhead:
        backends = list(overhead["ledgers"])
        bottom = [0.0] * len(backends)
        for step in STEPS:
            heights = [max(median(epoch_steps(results, b)[step]), 0.0) for b in backends]
            ax.bar(backends, heights, bottom=bottom, label=STEP_LABELS[step])
            bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
        ax.set(ylabel="s", title="Fixed cost of a small epoch by step")
        _legend(ax, 7)
    ax = axes[1][1]
    labels, totals = [], []
    for size in sizes:
        epochs = [e for r in tp[size] if "files" in r for e in r["files"]["epochs"]]
        if epochs:
            labels.append(f"{int(size):,}")
            totals.append(median(e["peak_total_mb"] for e in epochs))
    bounded = results.get("memory_bounded")
    if bounded:
        labels.append(f"{bounded['topic_records']:,}\nbatch {bounded['batch_records']:,}")
        totals.append(median(e["peak_total_mb"] for e in bounded["epochs"]))
    if labels:
        ax.bar(labels, totals)
    ax.set(xlabel="topic records", ylabel="MB", title="Peak memory per epoch (files pipeline)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(results: dict[str, Any], out: Path) -> None:
    """report.md, and report.png when matplotlib (the ``bench`` extra) is installed."""
    text = markdown(results)
    try:
        plot(results, out / "report.png")
    except ImportError:
        text = text.replace("![plots](report.png)", "(no plot: install the `bench` extra for matplotlib)")
    path = out / "report.md"
    (out / "report.md").write_text(text + kept_sections(path.read_text() if path.exists() else "", text))


# Sections that other bench scripts write into report.md between <!-- name --> and <!-- /name -->
# markers (bench/iceberg_bench.py): a new report keeps them.
_SECTION = re.compile(r"^<!-- ([a-z0-9-]+) -->\n.*?^<!-- /\1 -->\n?", re.MULTILINE | re.DOTALL)


def write_section(report: Path, section: str, begin: str, end: str) -> None:
    """Put ``section`` (which starts with ``begin`` and ends with ``end``) into ``report``: in place of
    the text between those markers, or at the end when the report has none yet."""
    text = report.read_text(encoding="utf-8") if report.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    report.write_text(text, encoding="utf-8")


def kept_sections(previous: str, new: str) -> str:
    """The marked sections of the previous report that the new one does not have."""
    kept = [m.group(0) for m in _SECTION.finditer(previous) if f"<!-- {m.group(1)} -->" not in new]
    return "".join("\n" + section.rstrip("\n") + "\n" for section in kept)


def main() -> None:
    """``python -m bench.report [report.json]``: render report.md and report.png again from the JSON."""
    import json
    import sys

    source = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "report.json"
    write(json.loads(source.read_text()), source.parent)


if __name__ == "__main__":
    main()
