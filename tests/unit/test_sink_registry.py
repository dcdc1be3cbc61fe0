"""Building sinks by kind from plain config mappings; bad config is named, not ignored."""

from __future__ import annotations

import pytest

from onceflow.errors import ConfigError
from onceflow.sinks import build_committer, build_writer, known_kinds
from onceflow.sinks.postgres_upsert import collapse_by_key


def test_every_kind_builds_a_writer_and_a_committer() -> None:
    base = {"dsn": "postgresql://u:p@127.0.0.1:1/db", "table": "t", "columns": {"id": "bigint"}}
    configs = {
        "postgres_2pc": base,
        "postgres_upsert": {**base, "key_columns": ["id"]},
        "postgres_changes": {**base, "key_columns": ["id"]},
        "plain": base,
        "wal": {**base, "root": "/tmp/wal"},
        "files": {"root": "/tmp/files", "table": "t"},
        "kafka": {"topic": "out", "staging_root": "/tmp/k", "bootstrap": "127.0.0.1:1"},
        "iceberg": {"table": "ns.t"},
        "delta": {"path": "/tmp/delta-t"},
        "iceberg_changes": {"table": "ns.t", "columns": {"id": "long"}, "key_columns": ["id"]},
        "delta_changes": {"path": "/tmp/delta-c", "columns": {"id": "long"}, "key_columns": ["id"]},
    }
    assert set(configs) == set(known_kinds())
    for kind, config in configs.items():
        writer, committer = build_writer(kind, config), build_committer(kind, config)
        for method in ("begin", "write", "pre_commit", "abort"):
            assert callable(getattr(writer, method))
        for method in ("commit", "abort", "orphans"):
            assert callable(getattr(committer, method))


def test_unknown_kinds_and_settings_are_named() -> None:
    with pytest.raises(ConfigError, match="'kafak'"):
        build_writer("kafak", {})
    with pytest.raises(ConfigError, match="'tabel'"):
        build_writer("files", {"root": "/tmp/f", "table": "t", "tabel": "x"})
    with pytest.raises(ConfigError, match="key_columns"):
        build_committer(
            "postgres_upsert", {"dsn": "postgresql://x/y", "table": "t", "columns": {"id": "int"}}
        )
    with pytest.raises(ConfigError, match="transaction_timeout_ms"):
        build_committer("kafka", {"topic": "o", "staging_root": "/tmp/k", "transaction_timeout_ms": "60s"})


def test_upsert_batches_keep_the_last_row_per_key() -> None:
    rows = [(1, "a", 1), (2, "a", 2), (1, "a", 3), (1, "b", 4)]
    assert collapse_by_key(rows, ("k1", "k2", "v"), ("k1", "k2")) == [(1, "a", 3), (2, "a", 2), (1, "b", 4)]


def test_each_kind_is_one_object_that_answers_for_itself() -> None:
    from onceflow.sinks import sink_kind

    kinds = {name: sink_kind(name) for name in known_kinds()}
    assert {n for n, k in kinds.items() if k.direct} == {"plain", "postgres_upsert"}
    assert {n for n, k in kinds.items() if k.replaceable} == {"files", "iceberg", "postgres_upsert"}
    assert {n for n, k in kinds.items() if k.guarantee == "at_least_once"} == {"plain", "wal"}
    assert kinds["kafka"].columns({"value_format": "json"}) is None
    assert kinds["kafka"].columns({}) == ["key", "value"]
    assert kinds["files"].columns({"columns": {"a": "int64", "b": "string"}}) == ["a", "b"]
    assert sink_kind("onceflow.testing:RECORDING_KIND").name == "recording"
    with pytest.raises(ConfigError, match="is not a SinkKind"):
        sink_kind("onceflow.testing:RecordingCommitter")
