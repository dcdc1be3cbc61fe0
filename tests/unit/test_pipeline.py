"""The pipeline spec: validation names the field and the value; JSON round trip; loading by dotted path."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from onceflow.errors import ConfigError
from onceflow.pipeline import (
    JsonFormat,
    KafkaSource,
    Pipeline,
    RawFormat,
    SinkSpec,
    StateSpec,
    load_pipeline,
)


def make(**overrides: Any) -> Pipeline:
    fields: dict[str, Any] = {
        "name": "orders",
        "source": KafkaSource(topics=("orders",)),
        "format": JsonFormat(schema={"id": "int", "amount": "float?"}, key_field="customer"),
        "sinks": (SinkSpec("pg", "postgres", {"table": "orders", "columns": ["id", "amount"]}),),
    }
    fields.update(overrides)
    return Pipeline(**fields)


def full() -> Pipeline:
    return make(
        source=KafkaSource(topics=["a", "b.c"], starting=1_700_000_000_000, on_missing_offsets="skip"),
        transform="my_jobs.orders:enrich",
        state=StateSpec(keys=["customer"], reducer="sum", column="amount", output="total", root="/tmp/s"),
        sinks=[SinkSpec("pg", "postgres", {"table": "t"}), SinkSpec("out", "kafka", {"topic": "x"})],
        guarantee="at_least_once",
        slices=1,
        max_records_per_partition=10,
        max_records_per_task=5,
        max_record_bytes=2048,
        transaction_timeout_s=60,
    )


def test_round_trip_through_json_gives_an_equal_spec() -> None:
    for spec in (make(), full(), make(format=RawFormat(), state=StateSpec(keys=("k",), reducer="count"))):
        text = spec.to_json()
        assert Pipeline.from_json(text) == spec
        assert Pipeline.from_dict(json.loads(text)).to_dict() == spec.to_dict()


def test_lists_are_frozen_and_config_cannot_change_behind_the_spec() -> None:
    config = {"table": "t"}
    spec = make(sinks=[SinkSpec("pg", "postgres", config)])
    config["table"] = "other"
    assert spec.sinks[0].config["table"] == "t"
    assert isinstance(spec.sinks, tuple)
    with pytest.raises(TypeError):
        spec.sinks[0].config["table"] = "x"  # type: ignore[index]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: make(guarantee="exactly-once"), "guarantee='exactly-once'"),
        (lambda: make(slices=0), "slices=0: expected an integer >= 1"),
        (lambda: make(slices=True), "slices=True"),
        (lambda: make(max_records_per_partition=-5), "max_records_per_partition=-5"),
        (lambda: make(max_records_per_task=0), "max_records_per_task=0"),
        (lambda: make(max_record_bytes=-1), "max_record_bytes=-1"),
        (lambda: make(transaction_timeout_s=0), "transaction_timeout_s=0"),
        (lambda: make(name="has space"), "name='has space'"),
        (lambda: make(name="a:b"), "name='a:b'"),
        (lambda: make(sinks=()), r"sinks=\[\]: expected at least one sink"),
        (
            lambda: make(sinks=(SinkSpec("x", "pg"), SinkSpec("x", "kafka"))),
            r"sinks=\['x'\]: duplicate sink names",
        ),
        (lambda: make(transform="no_colon"), "transform='no_colon'"),
        (lambda: make(source="orders"), "source='orders'"),
        (lambda: make(format={"id": "int"}), "format="),
        (lambda: KafkaSource(topics=()), r"source.topics=\[\]: expected at least one topic"),
        (lambda: KafkaSource(topics="orders"), "source.topics='orders'"),
        (lambda: KafkaSource(topics=("bad topic",)), "source.topics='bad topic'"),
        (lambda: KafkaSource(topics=("a", "a")), r"source.topics=\['a'\]: topics listed more than once"),
        (lambda: KafkaSource(topics=("a",), starting="newest"), "source.starting='newest'"),
        (lambda: KafkaSource(topics=("a",), starting=-1), "source.starting=-1"),
        (lambda: KafkaSource(topics=("a",), starting=True), "source.starting=True"),
        (
            lambda: KafkaSource(topics=("a",), on_missing_offsets="ignore"),
            "source.on_missing_offsets='ignore'",
        ),
        (lambda: JsonFormat(schema={}), "format.schema={}"),
        (lambda: JsonFormat(schema={"id": "integer"}), r"format.schema\['id'\]='integer'"),
        (
            lambda: JsonFormat(schema={"_offset": "int"}),
            r"format.schema\['_offset'\]='int': field name is reserved",
        ),
        (lambda: JsonFormat(schema={"id": "int"}, key_field="id"), "format.key_field='id': collides"),
        (lambda: SinkSpec("pg", "post-gres"), r"sinks\['pg'\].kind='post-gres'"),
        (lambda: SinkSpec("", "pg"), "sinks.name=''"),
        (
            lambda: SinkSpec("pg", "pg", {"when": object()}),
            r"sinks\['pg'\].config: must be JSON-serializable",
        ),
        (lambda: StateSpec(keys=(), reducer="sum", column="x"), r"state.keys=\(\)"),
        (lambda: StateSpec(keys=("k", "k"), reducer="count"), "state.keys=.*listed more than once"),
        (lambda: StateSpec(keys=("k",), reducer="median", column="x"), "state.reducer='median'"),
        (lambda: StateSpec(keys=("k",), reducer="sum"), "state.column=None: reducer 'sum' needs the column"),
        (lambda: StateSpec(keys=("k",), reducer="my.mod:fold", column="x"), "state.reducer='my.mod:fold'"),
        (lambda: StateSpec(keys=("k", "n"), reducer="sum", column="n"), "state.output='n'.*collides"),
        (
            lambda: make(state=StateSpec(keys=("k",), reducer="count"), slices=2),
            "slices=2: a pipeline with keyed state runs as one slice",
        ),
        (lambda: make(sinks=[SinkSpec("onceflow_state", "files")]), "reserved for the keyed state"),
        (
            lambda: make(state=StateSpec(keys=("k",), reducer="count"), on_rerun="replace"),
            "on_rerun='replace': keyed state would fold the interval's records twice",
        ),
        (lambda: make(on_rerun="again"), "on_rerun='again': expected one of"),
        (
            lambda: make(state=StateSpec(keys=("k",), reducer="count"), guarantee="at_most_once"),
            "guarantee='at_most_once': keyed state",
        ),
    ],
)
def test_invalid_specs_name_the_field_and_the_value(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("sinks"), r"pipeline: missing keys \['sinks'\]"),
        (lambda d: d.update(slice=2), r"pipeline: unknown keys \['slice'\]"),
        (lambda d: d.update(version=99), "version=99"),
        (lambda d: d["format"].update(type="protobuf"), "format.type='protobuf'"),
        (lambda d: d["source"].update(topic="x"), r"source: unknown keys \['topic'\]"),
        (lambda d: d.update(slices=0), "slices=0"),
    ],
)
def test_bad_dicts_are_rejected_by_name(mutate: Callable[[dict[str, Any]], object], message: str) -> None:
    data = full().to_dict()
    mutate(data)
    with pytest.raises(ConfigError, match=message):
        Pipeline.from_dict(data)
    with pytest.raises(ConfigError, match="not valid JSON"):
        Pipeline.from_json("{")


@pytest.fixture
def user_module() -> Iterator[types.ModuleType]:
    """A user module with a pipeline and a transform, importable by dotted path."""
    module = types.ModuleType("onceflow_test_user_pipelines")
    module.PIPELINE = make(transform="onceflow_test_user_pipelines:double")  # type: ignore[attr-defined]
    module.double = lambda frame: frame * 2  # type: ignore[attr-defined]
    module.NOT_A_PIPELINE = 42  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_load_pipeline_and_transform_by_dotted_path(user_module: types.ModuleType) -> None:
    spec = load_pipeline("onceflow_test_user_pipelines:PIPELINE")
    assert spec is user_module.PIPELINE
    assert spec.load_transform()(21) == 42
    assert make().load_transform()("frame") == "frame"


def test_loading_names_what_is_wrong(user_module: types.ModuleType) -> None:
    with pytest.raises(ConfigError, match="expected a onceflow Pipeline, found int"):
        load_pipeline("onceflow_test_user_pipelines:NOT_A_PIPELINE")
    with pytest.raises(ConfigError, match="has no attribute 'MISSING'"):
        load_pipeline("onceflow_test_user_pipelines:MISSING")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_xyz'"):
        load_pipeline("no_such_module_xyz:PIPELINE")
    with pytest.raises(ConfigError, match="does not name a callable"):
        make(transform="onceflow_test_user_pipelines:NOT_A_PIPELINE").load_transform()


def test_sink_lookup_by_name() -> None:
    spec = full()
    assert spec.sink("out").kind == "kafka"
    with pytest.raises(ConfigError, match=r"no sink 'nope'; sinks: \['pg', 'out'\]"):
        spec.sink("nope")


def test_a_spec_can_be_derived_with_dataclasses_replace() -> None:
    from dataclasses import replace

    spec = make(sinks=[SinkSpec("pg", "postgres", {"table": "t", "columns": {"id": "bigint"}})])
    derived = replace(spec, name="other", sinks=(replace(spec.sinks[0], name="pg2"),))
    assert derived.sinks[0].config == spec.sinks[0].config and derived.name == "other"


def test_state_keys_may_be_nested_fields_named_by_their_last_field() -> None:
    state = StateSpec(keys=("ctx.ip", "region", "`a.b`.c", "`x.y`"), reducer="count")
    assert state.key_columns == ("ip", "region", "c", "x.y")
    with pytest.raises(ConfigError, match=r"two keys give one column name \(\['id', 'id'\]\)"):
        StateSpec(keys=("a.id", "b.id"), reducer="count")
    for bad in ("ctx.", ".ip", "a..b", "`a"):
        with pytest.raises(ConfigError, match="a nested field as its path"):
            StateSpec(keys=(bad,), reducer="count")
    with pytest.raises(ConfigError, match="collides with a key"):
        StateSpec(keys=("ctx.qty",), reducer="sum", column="qty")
