"""The object storage step's report: one row per size with each system's median rate and range, the
ratios taken within each round, and the files commit in the bucket judged flat only at 10^7."""

from __future__ import annotations

import math
from typing import Any

from bench.report import _s3_section, markdown, s3_ratios, s3_summary, targets

COMMIT_TARGET = (
    "files commit in a bucket flat up to 10^7 rows: ≤ 1 s at 10^7, at most 0.25 s more than at the "
    "smallest epoch"
)


def round_(
    files: float, files_s3: float, iceberg: float, iceberg_s3: float, sss_s3: float | None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "load_before": [1.5, 0.0, 0.0],
        "runtime": "Spark Connect (sc://localhost:15002/;token=***)",
        "files": {"records_per_s": files},
        "files_s3": {"records_per_s": files_s3},
        "iceberg": {"records_per_s": iceberg},
        "iceberg_s3": {"records_per_s": iceberg_s3},
    }
    if sss_s3 is not None:
        entry["spark_structured_streaming_s3"] = {"records_per_s": sss_s3}
    return entry


def results(
    by_size: dict[str, list[dict[str, Any]]], commit: dict[str, list[float]] | None = None
) -> dict[str, Any]:
    found: dict[str, Any] = {
        "s3": {size: {"record_bytes": 200, "rounds": rounds} for size, rounds in by_size.items()}
    }
    if commit is not None:
        found["commit_cost"] = {"files_s3": commit}
    return found


def verdicts(found: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {target: (measured, verdict) for target, measured, verdict in targets(found)}


def test_ratios_are_taken_within_the_round() -> None:
    ratios = s3_ratios(round_(200_000, 180_000, 160_000, 120_000, 150_000))
    assert ratios == {
        "files_s3_vs_sss_s3": 1.2,
        "files_s3_vs_files": 0.9,
        "iceberg_s3_vs_iceberg": 0.75,
    }
    assert math.isnan(s3_ratios(round_(2e5, 1.8e5, 1.6e5, 1.2e5, None))["files_s3_vs_sss_s3"])
    line = s3_summary(round_(200_000, 180_000, 160_000, 120_000, 150_000))
    assert line.startswith("files 200000/s, files_s3 180000/s, iceberg 160000/s, iceberg_s3 120000/s")
    assert "files_s3_vs_sss_s3 1.20" in line


def test_one_row_per_size_with_medians_and_ranges_over_the_rounds() -> None:
    rounds = [
        round_(2e5, 1.8e5, 1.6e5, 1.2e5, 1.5e5),
        round_(2e5, 1.6e5, 1.6e5, 1.2e5, 1e5),
        round_(2e5, 2e5, 1.6e5, 1.2e5, 1e5),
    ]
    lines = _s3_section(results({"1000000": rounds[:1], "10000000": rounds}))
    header = next(line for line in lines if line.startswith("| records |"))
    assert header == (
        "| records | files local | files S3 | Iceberg local | Iceberg S3 | SS Parquet S3 | "
        "files S3 ÷ SS S3 | files S3 ÷ files local | Iceberg S3 ÷ Iceberg local |"
    )
    rows = [line for line in lines if line.startswith("| 1")]
    assert rows[0].startswith("| 1,000,000 (1 round) | 200,000 (2e+05–2e+05) | 180,000")
    assert rows[1] == (
        "| 10,000,000 (3 rounds) | 200,000 (2e+05–2e+05) | 180,000 (1.6e+05–2e+05) | "
        "160,000 (1.6e+05–1.6e+05) | 120,000 (1.2e+05–1.2e+05) | 100,000 (1e+05–1.5e+05) | "
        "1.60 (1.2–2) | 0.90 (0.8–1) | 0.75 (0.75–0.75) |"
    )


def test_without_structured_streaming_its_cells_are_empty() -> None:
    lines = _s3_section(results({"1000000": [round_(2e5, 1.8e5, 1.6e5, 1.2e5, None)]}))
    row = next(line for line in lines if line.startswith("| 1,000,000"))
    assert "nan" not in row and row.endswith("|  | 0.90 (0.9–0.9) | 0.75 (0.75–0.75) |")


def test_the_commit_in_the_bucket_is_judged_flat_at_10_7_only() -> None:
    flat = {"10000": [0.02, 0.03, 0.025], "10000000": [0.05, 0.06, 0.04]}
    assert verdicts(results({}, flat))[COMMIT_TARGET] == (
        "0.050 s at 10,000,000 rows, 0.025 s at 10,000",
        "met",
    )
    assert verdicts(results({}, {"10000": [0.02], "10000000": [0.5]}))[COMMIT_TARGET][1] == "MISSED"
    small = verdicts(results({}, {"10000": [0.02], "100000": [0.03]}))[COMMIT_TARGET]
    assert small == ("0.030 s at 100,000 rows, 0.020 s at 10,000 (10^7 not run)", "not measured at 10^7")
    lines = _s3_section(results({"1000000": [round_(2e5, 1.8e5, 1.6e5, 1.2e5, 1e5)]}, flat))
    assert "| files S3 commit s | 0.025 (0.02–0.03) | 0.05 (0.04–0.06) | met |" in lines


def test_nothing_measured_gives_no_section_and_the_whole_report_renders() -> None:
    assert _s3_section({}) == []
    assert COMMIT_TARGET not in verdicts({})
    meta = {
        "command": "python -m bench.run --steps s3",
        "started": "now",
        "cpus": 2,
        "machine": "m",
        "python": "3.11",
        "load_before": [0.5, 0.5, 0.5],
        "record_bytes": 200,
        "partitions": 4,
        "sizes": [100_000],
        "runs": 1,
    }
    found = results({"100000": [round_(2e5, 1.8e5, 1.6e5, 1.2e5, 1e5)]}, {"10000": [0.01]})
    text = markdown({**found, "meta": meta})
    assert "## Object storage: files and Iceberg in an S3 bucket beside the local disk" in text
    assert "| files_s3 | 0.01 (0.01–0.01) |" in text  # the commit table lists it with the other sinks
