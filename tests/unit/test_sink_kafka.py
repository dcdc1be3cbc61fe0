"""Pure parts of the kafka sink: the staged record format, slice grouping and the slice's offsets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.errors import ConfigError
from onceflow.offsets import OffsetRange
from onceflow.sinks.base import Committable
from onceflow.sinks.errors import RowError, SinkError, StagedOutputCorrupt
from onceflow.sinks.kafka import (
    KafkaSinkConfig,
    encode_record,
    group_by_slice,
    json_record,
    read_records,
    slice_until_offsets,
    transactional_id,
    transactional_id_prefix,
)

records = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.binary(max_size=40)), max_size=30
)


@given(records)
def test_staged_records_read_back_in_order(
    tmp_path_factory: pytest.TempPathFactory, items: list[tuple[bytes | None, bytes]]
) -> None:
    path = tmp_path_factory.mktemp("rec") / "records.bin"
    path.write_bytes(b"".join(encode_record({"key": k, "value": v}) for k, v in items))
    assert list(read_records(path)) == items


def test_strings_are_utf8_and_bad_rows_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.bin"
    path.write_bytes(encode_record({"key": "clé", "value": "välue"}) + encode_record({"value": b"v"}))
    assert list(read_records(path)) == [("clé".encode(), "välue".encode()), (None, b"v")]
    with pytest.raises(RowError, match="topic"):
        encode_record({"value": b"v", "topic": "x"})
    with pytest.raises(RowError, match="value"):
        encode_record({"key": b"k"})
    with pytest.raises(RowError, match="int"):
        encode_record({"value": 5})


def test_json_value_format_keys_records_by_a_column_and_checks_its_config() -> None:
    row = {"id": 7, "_partition": 2, "payload": "é"}
    assert json_record(row, "_partition") == {
        "key": "2",
        "value": '{"_partition": 2, "id": 7, "payload": "é"}',
    }
    assert json_record(row, None)["key"] is None
    with pytest.raises(RowError, match="key_column 'k'"):
        json_record(row, "k")
    base = {"topic": "t", "staging_root": "/tmp/s", "bootstrap": "h:1"}
    assert (
        KafkaSinkConfig.from_mapping({**base, "value_format": "json", "key_column": "id"}).key_column == "id"
    )
    with pytest.raises(ConfigError, match="value_format='xml'"):
        KafkaSinkConfig.from_mapping({**base, "value_format": "xml"})
    with pytest.raises(ConfigError, match="key_column: only used with value_format 'json'"):
        KafkaSinkConfig.from_mapping({**base, "key_column": "id"})


def test_a_truncated_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "r.bin"
    path.write_bytes(encode_record({"key": b"k", "value": b"value"})[:-2])
    with pytest.raises(StagedOutputCorrupt):
        list(read_records(path))


def committable(slice_: int, task: str, *ranges: tuple[int, int, int]) -> Committable:
    inputs = tuple(OffsetRange("in", p, a, b) for p, a, b in ranges)
    return Committable("p", 1, slice_, task, "a1", "out", inputs)


def test_grouping_by_slice_keeps_natural_task_order() -> None:
    cs = [committable(1, "s1-t0"), committable(0, "s0-t10"), committable(0, "s0-t2"), committable(0, "s0-t1")]
    groups = group_by_slice(cs)
    assert list(groups) == [0, 1]
    assert [c.task for c in groups[0]] == ["s0-t1", "s0-t2", "s0-t10"]


def test_slice_offsets_are_the_max_until_per_partition() -> None:
    cs = [committable(0, "s0-t0", (0, 0, 5), (1, 3, 4)), committable(0, "s0-t1", (0, 5, 9), (1, 4, 4))]
    assert slice_until_offsets(cs) == {("in", 0): 9, ("in", 1): 4}
    with pytest.raises(SinkError, match="input offsets"):
        slice_until_offsets([committable(0, "s0-t0")])


def test_transactional_id_is_fixed_per_pipeline_sink_and_slice() -> None:
    assert transactional_id("orders", "out", 3) == "onceflow:orders:out:s3"
    assert transactional_id("orders", "out", 3).startswith(transactional_id_prefix("orders"))


names = st.text(alphabet="ab-_.0", min_size=1, max_size=6).filter(lambda s: s not in {".", ".."})


def test_names_with_dashes_never_share_a_transactional_id() -> None:
    """Pipeline ``a-b`` with sink ``c`` and pipeline ``a`` with sink ``b-c`` must not fence each other."""
    assert transactional_id("a-b", "c", 0) != transactional_id("a", "b-c", 0)
    assert transactional_id("a", "b-s0", 1) != transactional_id("a-b", "s0", 1)
    assert not transactional_id("a-b", "c", 0).startswith(transactional_id_prefix("a"))


@given(names, names, st.integers(0, 99), names, names, st.integers(0, 99))
def test_transactional_ids_differ_whenever_pipeline_sink_or_slice_differ(
    p1: str, s1: str, n1: int, p2: str, s2: str, n2: int
) -> None:
    same = (p1, s1, n1) == (p2, s2, n2)
    assert (transactional_id(p1, s1, n1) == transactional_id(p2, s2, n2)) == same
