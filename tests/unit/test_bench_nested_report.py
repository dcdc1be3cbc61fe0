"""The nested step's report: each round's rates and ratios, then their medians, rendered by the same
table as the Avro step's; a peer that did not run leaves its columns and ratios out."""

from __future__ import annotations

import math
from typing import Any

from bench.dataset import NESTED_RECORD_BYTES, NESTED_SCHEMA, nested_record
from bench.report import _nested_section, nested_ratios, nested_summary


def round_(
    flat: float, nested: float, jvm: float, sss: float | None, sss_nested: float | None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "load_before": [1.5, 0.0, 0.0],
        "runtime": "Spark Connect",
        "files": {"records_per_s": flat},
        "files_nested": {"records_per_s": nested},
        "files_nested_jvm": {"records_per_s": jvm},
    }
    if sss is not None and sss_nested is not None:
        entry["spark_structured_streaming"] = {"records_per_s": sss}
        entry["spark_structured_streaming_nested"] = {"records_per_s": sss_nested}
    return entry


def section(rounds: list[dict[str, Any]]) -> str:
    found = {"json_value_bytes": 200, "nested_value_bytes": 600, "rounds": rounds}
    return "\n".join(_nested_section({"nested": {"1000000": found}}))


def test_ratios_are_taken_within_the_round() -> None:
    assert nested_ratios(round_(40_000, 30_000, 24_000, 50_000, 20_000)) == {
        "nested_vs_sss": 1.5,
        "nested_jvm_vs_sss": 1.2,
        "nested_vs_flat": 0.75,
    }
    assert math.isnan(nested_ratios(round_(40_000, 30_000, 24_000, None, None))["nested_vs_sss"])


def test_the_section_has_a_row_per_round_and_the_medians() -> None:
    text = section(
        [round_(40_000, 30_000, 24_000, 50_000, 20_000), round_(30_000, 15_000, 20_000, 40_000, 30_000)]
    )
    assert "1,000,000 records; a value is 200 bytes flat, 600 nested" in text
    assert "| 1 | 1.50 | 40,000 | 30,000 | 24,000 | 50,000 | 20,000 | 1.50 | 1.20 | 0.75 |" in text
    assert "| 2 | 1.50 | 30,000 | 15,000 | 20,000 | 40,000 | 30,000 | 0.50 | 0.67 | 0.50 |" in text
    assert "| median | | 35,000" in text and "| 1.00 (0.5–1.5) |" in text


def test_without_structured_streaming_its_ratios_are_left_out() -> None:
    text = section([round_(40_000, 30_000, 24_000, None, None)])
    assert "nan" not in text and "Structured Streaming, nested" not in text
    assert "| 1 | 1.50 | 40,000 | 30,000 | 24,000 | 0.75 |" in text
    assert _nested_section({}) == []
    assert nested_summary(round_(40_000, 30_000, 24_000, None, None)).startswith("files 40000/s")


def test_the_nested_records_are_what_the_schema_reads_and_of_one_size() -> None:
    from onceflow.decoding.records import KafkaRecord, RowDecoder
    from onceflow.pipeline import JsonFormat

    decoder = RowDecoder(JsonFormat(schema=NESTED_SCHEMA), 10_000)
    for i in (0, 7, 123_456, 9_999_999):
        value = nested_record(i)
        assert len(value) == NESTED_RECORD_BYTES
        row = decoder.decode_row(KafkaRecord("t", 0, i, None, b"k", value))
        assert isinstance(row, dict) and len(row["items"]) == 5 and row["id"] == i
