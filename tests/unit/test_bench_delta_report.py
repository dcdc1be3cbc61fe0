"""The Delta step's report: each round's rates and ratios with Structured Streaming's Delta sink, the
target judged at 10^7 only, and the Delta commit's flatness against epoch size."""

from __future__ import annotations

import math
from typing import Any

from bench.report import _delta_section, delta_ratios, delta_summary, markdown, targets

THROUGHPUT_TARGET = "Delta pipeline ≥ 1.2× Structured Streaming's Delta sink at 10^7 records"


def round_(files: float, iceberg: float, delta: float, sss_delta: float | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "load_before": [1.5, 0.0, 0.0],
        "runtime": "Spark Connect (sc://localhost:15002/;token=***)",
        "files": {"records_per_s": files},
        "iceberg": {"records_per_s": iceberg},
        "delta": {"records_per_s": delta},
    }
    if sss_delta is not None:
        entry["spark_structured_streaming_delta"] = {"records_per_s": sss_delta}
    return entry


def results(
    by_size: dict[str, list[dict[str, Any]]], commit: dict[str, list[float]] | None = None
) -> dict[str, Any]:
    found: dict[str, Any] = {
        "delta": {size: {"record_bytes": 200, "rounds": rounds} for size, rounds in by_size.items()}
    }
    if commit is not None:
        found["commit_cost"] = {"delta": commit}
    return found


def verdicts(found: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {target: (measured, verdict) for target, measured, verdict in targets(found)}


def test_ratios_are_taken_within_the_round() -> None:
    ratios = delta_ratios(round_(200_000, 160_000, 180_000, 120_000))
    assert ratios == {"delta_vs_sss_delta": 1.5, "delta_vs_files": 0.9, "delta_vs_iceberg": 1.125}
    assert math.isnan(delta_ratios(round_(200_000, 160_000, 180_000, None))["delta_vs_sss_delta"])
    line = delta_summary(round_(200_000, 160_000, 180_000, 120_000))
    assert line.startswith("files 200000/s, iceberg 160000/s, delta 180000/s")
    assert "delta_vs_sss_delta 1.50" in line


def test_the_target_is_judged_on_the_median_of_the_10_7_rounds() -> None:
    met = [
        round_(2e5, 1.6e5, 1.9e5, 1.5e5),
        round_(2e5, 1.6e5, 1.7e5, 1.5e5),
        round_(2e5, 1.6e5, 1.2e5, 1.5e5),
    ]
    assert verdicts(results({"10000000": met}))[THROUGHPUT_TARGET] == ("1.133× (0.8–1.27)", "MISSED")
    fast = [round_(2e5, 1.6e5, 1.9e5, 1.5e5), round_(2e5, 1.6e5, 1.9e5, 1.5e5)]
    assert verdicts(results({"10000000": fast}))[THROUGHPUT_TARGET][1] == "met"


def test_a_run_without_10_7_says_so_instead_of_claiming_the_target() -> None:
    found = results({"1000000": [round_(2e5, 1.6e5, 1.9e5, 1e5)]})
    measured, verdict = verdicts(found)[THROUGHPUT_TARGET]
    assert verdict == "not measured at 10^7"
    assert measured == "1.900× at 1,000,000 (10^7 not run)"
    text = "\n".join(_delta_section(found))
    assert "- 10^6 records: onceflow Delta ÷ Structured Streaming Delta 1.90 (1.9–1.9); the target" in text
    assert "set at 10^7" in text


def test_the_section_has_a_row_per_round_the_medians_and_the_verdict_at_10_7() -> None:
    rounds = [round_(2e5, 1.6e5, 1.9e5, 1.5e5), round_(2.2e5, 1.5e5, 2e5, 1.4e5)]
    lines = _delta_section(results({"10000000": rounds}))
    assert "| 1 | 1.50 | 200,000 | 160,000 | 190,000 | 150,000 | 1.27 | 0.95 | 1.19 |" in lines
    median_row = next(line for line in lines if line.startswith("| median |"))
    assert "| 1.35 (1.27–1.43) |" in median_row
    assert (
        "- 10^7 records: onceflow Delta ÷ Structured Streaming Delta 1.35 (1.27–1.43); target ≥ 1.2×: met."
        in lines
    )


def test_without_structured_streaming_its_column_and_ratio_are_left_out() -> None:
    text = "\n".join(_delta_section(results({"1000000": [round_(2e5, 1.6e5, 1.9e5, None)]})))
    table = text.split("| round |", 1)[1]
    assert "Structured Streaming" not in table and "nan" not in text
    assert THROUGHPUT_TARGET not in verdicts(results({"1000000": [round_(2e5, 1.6e5, 1.9e5, None)]}))


def test_the_commit_is_flat_when_the_10_7_epoch_commits_in_about_the_time_of_a_small_one() -> None:
    target = next(t for t, _, _ in targets(results({}, {"10000": [0.01]})) if t.startswith("delta commit"))
    flat = {"10000": [0.01, 0.012, 0.011], "10000000": [0.05, 0.06, 0.04]}
    assert verdicts(results({}, flat))[target] == ("0.050 s at 10,000,000 rows, 0.011 s at 10,000", "met")
    grows = {"10000": [0.01], "10000000": [0.4]}
    assert verdicts(results({}, grows))[target][1] == "MISSED"
    small = {"10000": [0.01], "1000000": [0.02]}
    assert verdicts(results({}, small))[target][1] == "not measured at 10^7"
    lines = _delta_section(results({"1000000": [round_(2e5, 1.6e5, 1.9e5, 1e5)]}, flat))
    assert "| delta commit s | 0.011 (0.01–0.012) | 0.05 (0.04–0.06) | met |" in lines


def test_nothing_measured_gives_no_section_and_the_whole_report_renders() -> None:
    assert _delta_section({}) == []
    meta = {
        "command": "python -m bench.run --steps delta",
        "started": "now",
        "cpus": 2,
        "machine": "m",
        "python": "3.11",
        "load_before": [0.5, 0.5, 0.5],
        "record_bytes": 200,
        "partitions": 4,
        "sizes": [1_000_000],
        "runs": 1,
    }
    found = results({"1000000": [round_(2e5, 1.6e5, 1.9e5, 1e5)]}, {"10000": [0.01]})
    text = markdown({**found, "meta": meta})
    assert "## Delta beside files, Iceberg and Structured Streaming's Delta sink" in text
    assert "| delta | 0.01 (0.01–0.01) |" in text  # the commit table lists the Delta sink with the others
