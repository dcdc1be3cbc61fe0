"""bench/report.md keeps the sections other bench scripts wrote into it when the main report is redone."""

from __future__ import annotations

from typing import Any

from bench.report import kept_sections

ICEBERG = "<!-- iceberg-bench -->\n## Iceberg commit\n| 10^4 | 0.010 s |\n<!-- /iceberg-bench -->\n"


def test_a_marked_section_survives_a_new_report_that_lacks_it() -> None:
    previous = "# onceflow benchmarks\n\nold figures\n\n" + ICEBERG
    assert kept_sections(previous, "# onceflow benchmarks\n\nnew figures\n").strip() == ICEBERG.strip()


def test_a_section_the_new_report_has_is_not_doubled_and_nothing_else_is_kept() -> None:
    assert kept_sections("# old\n\n" + ICEBERG, "# new\n" + ICEBERG) == ""
    assert kept_sections("# old report without sections\n", "# new\n") == ""


def test_cpu_between_two_looks_counts_a_process_that_exits_once() -> None:
    from bench.spark_jobs import cpu_spent

    before = {"executor Python workers": {10: 5.0, 11: 2.0, -1: 1.0}, "driver": {1: 3.0}}
    # Worker 11 ran 0.5 s more, exited and was reaped: its 2.5 s are now under its executor (-1). Worker
    # 10 ran 1 s, worker 12 is new and ran 0.5 s.
    after = {"executor Python workers": {10: 6.0, 12: 0.5, -1: 3.5}, "driver": {1: 3.25}}
    assert cpu_spent(before, after) == {"executor Python workers": 2.0, "driver": 0.25}


def test_the_sustained_targets_hold_for_the_postgresql_pipeline_too() -> None:
    """Each ratio target is checked for the files and the PostgreSQL two-phase pipeline, each with its
    own verdict: a fast files pipeline does not carry a slower PostgreSQL one."""
    from bench.report import targets

    rate = {"records_per_s": 0.0}
    round_ = {
        "limit": rate | {"records_per_s": 150_000.0},
        "machine_limit": rate | {"records_per_s": 400_000.0},
        "files": rate | {"records_per_s": 210_000.0},
        "postgres_2pc": rate | {"records_per_s": 170_000.0},
        "spark_structured_streaming": rate | {"records_per_s": 150_000.0},
        "quix_streams": rate | {"records_per_s": 60_000.0},
    }
    rows = {target: verdict for target, _, verdict in targets({"throughput": {"10000000": [round_]}})}
    assert rows["pipeline ≥ 1.2× Spark Structured Streaming at 10^7 records"] == "met"
    assert rows["PostgreSQL two-phase pipeline ≥ 1.5× Spark Structured Streaming at 10^7 records"] == "MISSED"
    assert rows["pipeline ≥ 0.5× the machine's limit at 10^7 records"] == "met"
    assert rows["PostgreSQL two-phase pipeline ≥ 0.5× the machine's limit at 10^7 records"] == "MISSED"
    assert rows["PostgreSQL two-phase pipeline ≥ 1.2× quix-streams at 10^7 records"] == "met"


def _machine_round(python: float, jvm: float, native: float, files: float) -> dict[str, Any]:
    """A throughput round with the machine's figures: the machine's limit from the read and the decode
    seconds of 10^7 records of 200 bytes, as `bench.limit.measure` stores it."""
    read_s, decode_s = 1e7 / jvm, 1e7 / native
    machine = 1e7 / (read_s + decode_s)
    return {
        "limit": {"records_per_s": python, "mb_per_s": python * 200 / 1e6},
        "jvm_consumer": {"records_per_s": jvm, "mb_per_s": jvm * 200 / 1e6, "seconds": read_s},
        "native_decode_write": {"records_per_s": native, "mb_per_s": native * 200 / 1e6, "seconds": decode_s},
        "machine_limit": {
            "records_per_s": machine,
            "mb_per_s": machine * 200 / 1e6,
            "read_s": read_s,
            "decode_write_s": decode_s,
        },
        "files": {"records_per_s": files},
        "postgres_2pc": {"records_per_s": files * 0.8},
    }


def _table_row(lines: list[str], size: str, system: str) -> list[str]:
    """The cells after the system's name of the throughput table's row for ``size`` and ``system``."""
    prefix = f"| {size} | {system} |"
    found = [line for line in lines if line.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return [cell.strip() for cell in found[0][len(prefix) :].strip(" |").split("|")]


def test_every_pipeline_is_shown_against_the_machines_limit_and_one_python_consumer() -> None:
    """The machine's limit is the records over the read time plus the decode-and-write time (2.0 M/s
    read and 1.5 M/s decoded make 0.857 M/s); each pipeline is a fraction of it and of one Python
    consumer, per round, then the median; an older report's rounds without the machine's figures show
    a dash, not an error."""
    from bench.report import _throughput_section, targets

    new = [_machine_round(150_000, 2_000_000, 1_500_000, 480_000) for _ in range(3)]
    old = [
        {
            "limit": {"records_per_s": 160_000.0, "mb_per_s": 32.0},
            "files": {"records_per_s": 200_000.0, "epochs": []},
        }
    ]
    results = {
        "meta": {"batch_records": 1_000_000, "record_bytes": 200},
        "throughput": {"10000000": new, "1000000": old},
    }
    lines = _throughput_section(results)
    header = next(line for line in lines if line.startswith("| records | system |"))
    assert "× one Python consumer | × machine's limit |" in header
    machine = _table_row(
        lines, "10,000,000", "the machine's limit: JVM consumer's read + native decode and write"
    )
    assert machine[0].startswith("857,143") and machine[1] == "171" and machine[3] == "1.000"
    assert _table_row(lines, "10,000,000", "Kafka's JVM consumer (ConsumerPerformance), read only")[:2] == [
        "2,000,000 (2e+06–2e+06)",
        "400",
    ]
    files = _table_row(lines, "10,000,000", "onceflow exactly-once → Parquet files")
    assert files[2:4] == ["3.200", "0.560"]  # × one Python consumer, × machine's limit
    python = _table_row(lines, "10,000,000", "one Python consumer (confluent-kafka), read only")
    assert python[2:4] == ["1.000", "0.175"]
    assert not any("the limit" in line for line in lines)
    # The older round: its one Python consumer and pipeline render, the machine's figures are dashes.
    assert _table_row(lines, "1,000,000", "onceflow exactly-once → Parquet files")[2:4] == ["1.250", "—"]
    assert (
        _table_row(lines, "1,000,000", "Kafka's JVM consumer (ConsumerPerformance), read only")[:4]
        == ["—"] * 4
    )
    ratios_header = next(line for line in lines if line.startswith("| records | exactly-once"))
    columns = [cell.strip() for cell in ratios_header.strip(" |").split("|")]
    assert columns[2:4] == ["files pipeline ÷ machine's limit", "files pipeline ÷ one Python consumer"]
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| 1") and "(" in line}
    for size in ("10,000,000", "1,000,000"):
        cells = [cell.strip() for cell in rows[size].strip(" |").split("|")]
        assert len(cells) == len(columns)  # one cell per heading
    ten_million = [cell.strip() for cell in rows["10,000,000"].strip(" |").split("|")]
    assert ten_million[2].startswith("0.560") and ten_million[3].startswith("3.200")
    assert [cell.strip() for cell in rows["1,000,000"].strip(" |").split("|")][2] == "—"
    verdicts = {target: (measured, verdict) for target, measured, verdict in targets(results)}
    assert verdicts["pipeline ≥ 0.5× the machine's limit at 10^7 records"] == ("0.560×", "met")
    slow = {**results, "throughput": {"10000000": [_machine_round(150_000, 2e6, 1.5e6, 400_000)]}}
    assert dict((t, v) for t, _, v in targets(slow))[
        "pipeline ≥ 0.5× the machine's limit at 10^7 records"
    ] == ("MISSED")
    # Measured against one Python consumer only (an older report): the target is not measured.
    older = {**results, "throughput": {"10000000": old}}
    assert ("pipeline ≥ 0.5× the machine's limit at 10^7 records", "not measured", "not measured") in targets(
        older
    )


def test_the_jvm_consumers_summary_line_is_read_by_field_name() -> None:
    from bench.limit import parse_perf_line

    header = (
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
        "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
    )
    line = (
        "2026-11-29 00:37:52:510, 2026-11-29 00:37:52:970, 19.5397, 42.4777, 100000, 217391.3043, 249, "
        "211, 92.6053, 473933.6493"
    )
    fields = parse_perf_line(header, line)
    assert fields["fetch.time.ms"] == 211 and fields["data.consumed.in.nMsg"] == 100_000
    assert fields["rebalance.time.ms"] == 249 and "start.time" not in fields


def test_each_cut_is_shown_beside_the_code_before_it_with_the_ratio_of_each_round() -> None:
    from bench.report import _cuts_section

    def rate(value: float) -> dict[str, float]:
        return {"records_per_s": value}

    results = {
        "meta": {"batch_records": 1_000_000},
        "cuts": {
            "10000000": {
                "records": 10_000_000,
                "read_task": [
                    {"records": 250_000, "record_by_record": rate(400_000), "batches": rate(500_000)},
                    {"records": 250_000, "record_by_record": rate(500_000), "batches": rate(550_000)},
                    {"records": 250_000, "record_by_record": rate(450_000), "batches": rate(900_000)},
                ],
                "task_size": [
                    {"tasks_50000": rate(200_000), "tasks_250000": rate(400_000)},
                    {"tasks_50000": rate(250_000), "tasks_250000": rate(300_000)},
                    {"tasks_50000": rate(220_000), "tasks_250000": rate(330_000)},
                ],
            }
        },
    }
    lines = [line for line in _cuts_section(results) if line.startswith("| ") and "---" not in line][1:]
    batches, tasks = lines
    # The ratios are taken within each round (1.25, 1.1, 2.0 and 2.0, 1.2, 1.5), then their median.
    assert "450,000 (4e+05–5e+05)" in batches and "550,000" in batches and "| 1.25×" in batches
    assert "250,000 records" in batches
    assert "read tasks of 250,000 offsets (was 50,000)" in tasks and "| 1.50×" in tasks
    assert "epochs of 1,000,000" in tasks


def test_the_profile_puts_each_worker_sample_in_its_first_part_and_reports_cpu_per_record(
    tmp_path: Any,
) -> None:
    from bench.profile import DAEMON_PART, worker_shares
    from bench.report import _profile_section

    raw = tmp_path / "raw.txt"
    raw.write_text(
        "worker (pyspark/daemon.py:82);read (onceflow/engine/jvm_read.py:56);read_range_batches (x.py:92) 6\n"
        "worker (pyspark/daemon.py:82);BatchDecoder.decode (r.py:86);NativeJsonDecoder.decode (a.py:115) 3\n"
        "worker (pyspark/daemon.py:82);write_task_sinks (w.py:1);write_table (pyarrow/parquet/core.py:1) 2\n"
        "manager (pyspark/daemon.py:163) 1\n"
    )
    shares = worker_shares(raw)
    assert shares == {
        "read: the Kafka fetch (consume, one pass each for errors and offsets)": 0.5,
        "read: Arrow's JSON reader over a batch, with its checks": 0.25,
        "write: Parquet encoding and writing": 2 / 12,
        DAEMON_PART: 1 / 12,
    }
    results = {
        "profile": {
            "10000000": {
                "records": 10_000_000,
                "records_per_s": 400_000.0,
                "wall_s": 25.0,
                "cores": 2,
                "cpu_s": {"python workers": 20.0, "Kafka broker": 5.0},
                "workers": 80,
                "runtime": "lean",
                "worker_shares": shares,
            }
        }
    }
    text = "\n".join(_profile_section(results))
    assert "| python workers | 20.0 | 2.00 | 40% |" in text
    assert "| all | 25.0 | 2.50 | 50% |" in text
    assert "| read: the Kafka fetch (consume, one pass each for errors and offsets) | 50.0% | 1.00 |" in text
