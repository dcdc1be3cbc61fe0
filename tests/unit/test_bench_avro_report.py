"""The Avro step's report: each round's rates and ratios, then their medians, and a ratio a round could
not take (a peer that did not run) left out rather than shown as nan."""

from __future__ import annotations

import math
from typing import Any

from bench.report import _avro_section, avro_ratios, avro_summary


def round_(
    files: float, avro: float, sss: float | None, sss_avro: float | None, load: float
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "load_before": [load, 0.0, 0.0],
        "runtime": "Spark Connect (sc://localhost:15002/;token=***)",
        "files": {"records_per_s": files},
        "files_avro": {"records_per_s": avro},
    }
    if sss is not None and sss_avro is not None:
        entry["spark_structured_streaming"] = {"records_per_s": sss}
        entry["spark_structured_streaming_avro"] = {"records_per_s": sss_avro}
    return entry


def results(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    found = {
        "json_value_bytes": 200,
        "avro_value_bytes": 157.4,
        "registry": "schema registry x",
        "rounds": rounds,
    }
    return {"avro": {"1000000": found}}


def test_ratios_are_taken_within_the_round() -> None:
    ratios = avro_ratios(round_(40_000, 20_000, 32_000, 50_000, 2.0))
    assert ratios == {
        "avro_vs_json": 0.5,
        "avro_vs_sss_avro": 0.4,
        "json_vs_sss_json": 1.25,
        "sss_avro_vs_json": 50_000 / 32_000,
    }
    assert math.isnan(avro_ratios(round_(40_000, 20_000, None, None, 2.0))["avro_vs_sss_avro"])


def test_the_section_has_a_row_per_round_and_the_medians() -> None:
    rounds = [
        round_(40_000, 20_000, 32_000, 50_000, 2.0),
        round_(30_000, 24_000, 30_000, 40_000, 3.5),
        round_(50_000, 10_000, 25_000, 50_000, 9.1),
    ]
    lines = _avro_section(results(rounds))
    text = "\n".join(lines)
    assert "1,000,000 records; a value is 200 bytes as JSON, 157.4 as Avro" in text
    rows = [line for line in lines if line.startswith("| 1 |") or line.startswith("| median |")]
    assert rows[0] == "| 1 | 2.00 | 40,000 | 20,000 | 32,000 | 50,000 | 0.50 | 0.40 | 1.25 | 1.56 |"
    # Medians of the rates and of the per-round ratios (Avro ÷ JSON: 0.5, 0.8, 0.2 → 0.5).
    assert rows[1].startswith("| median | | 40,000 (3e+04–5e+04) | 20,000 (1e+04–2.4e+04) |")
    assert "| 0.50 (0.2–0.8) |" in rows[1]


def test_without_structured_streaming_its_columns_and_ratios_are_left_out() -> None:
    text = "\n".join(_avro_section(results([round_(40_000, 20_000, None, None, 2.0)])))
    assert "from_avro" not in text.split("| round |", 1)[1]
    assert "nan" not in text
    assert "| 1 | 2.00 | 40,000 | 20,000 | 0.50 |" in text


def test_nothing_measured_gives_no_section_and_the_log_line_names_every_rate() -> None:
    assert _avro_section({}) == []
    line = avro_summary(round_(40_000, 20_000, 32_000, 50_000, 2.0))
    assert line.startswith("files 40000/s, files_avro 20000/s, spark_structured_streaming 32000/s")
    assert "avro_vs_sss_avro 0.40" in line
