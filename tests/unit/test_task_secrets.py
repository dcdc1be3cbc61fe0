"""No secret leaves the process that owns it: a slice's tasks get the deployment's settings they read
(a sink's DSN where that sink needs it) and no other, and no repr of the settings shows a password."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyspark import cloudpickle

from onceflow.config import Settings
from onceflow.executor.slices import SliceRef
from onceflow.offsets import OffsetRange
from onceflow.pipeline import JsonFormat, KafkaSource, Pipeline, SinkSpec

PG_PW, LEDGER_PW, TOKEN, REGISTRY_PW = "pg-PW-0001", "ledger-PW-0002", "token-0003", "registry-PW-0004"
RANGE = OffsetRange("in", 0, 0, 4)


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(
        {
            "ONCEFLOW_HOME": str(tmp_path),
            "ONCEFLOW_PG_DSN": f"postgresql://onceflow:{PG_PW}@127.0.0.1:1/onceflow",
            "ONCEFLOW_LEDGER_URL": f"postgresql+psycopg://onceflow@127.0.0.1:1/ledger?password={LEDGER_PW}",
            "ONCEFLOW_SPARK_REMOTE": f"sc://localhost:15002/;token={TOKEN}",
            "ONCEFLOW_SCHEMA_REGISTRY_URL": f"https://reader:{REGISTRY_PW}@registry.example:8081",
        }
    )


def _ref(tmp_path: Path, *sinks: SinkSpec) -> SliceRef:
    spec = Pipeline("p", KafkaSource(("in",)), JsonFormat({"n": "int"}), sinks)
    return SliceRef(spec, 1, 0, (RANGE,), "127.0.0.1:1", settings=_settings(tmp_path))


def _shipped(ref: SliceRef) -> str:
    """Everything a task's closure holds of the ref, as Spark pickles it."""
    return cloudpickle.dumps(ref).decode("latin-1")


FILES = SinkSpec("out", "files", {"root": "/tmp/out", "table": "t"})
PG = SinkSpec("rows", "postgres_upsert", {"table": "t", "columns": {"n": "bigint"}, "key_columns": ["n"]})


def test_tasks_of_a_files_sink_carry_no_secret_but_the_registry_they_read(tmp_path: Path) -> None:
    shipped = _shipped(_ref(tmp_path, FILES))
    assert LEDGER_PW not in shipped and TOKEN not in shipped and PG_PW not in shipped
    assert REGISTRY_PW in shipped  # Avro tasks look writer schemas up: the registry's reader login


def test_a_postgresql_sink_gets_its_dsn_and_nothing_else(tmp_path: Path) -> None:
    ref = _ref(tmp_path, FILES, PG)
    shipped = _shipped(ref)
    assert LEDGER_PW not in shipped and TOKEN not in shipped
    assert ref.task.sink_config(PG)["dsn"] == f"postgresql://onceflow:{PG_PW}@127.0.0.1:1/onceflow"
    assert "dsn" not in ref.task.sink_config(FILES)
    with pytest.raises(KeyError):
        ref.task.sink_config(SinkSpec("other", "files", {"root": "/x", "table": "t"}))


def test_no_repr_or_log_line_of_the_settings_or_the_ref_shows_a_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path)
    ref = _ref(tmp_path, FILES, PG)
    caplog.set_level(logging.INFO)
    logging.getLogger("onceflow.test").info("settings %s, %r; ref %r", settings, settings, ref)
    shown = [repr(settings), str(settings), repr(ref), caplog.text]
    for secret in (PG_PW, LEDGER_PW, TOKEN, REGISTRY_PW):
        assert not [text for text in shown if secret in text], secret
    assert PG_PW not in repr(ref.task) and REGISTRY_PW not in repr(ref.task)  # a task's own log line
    # What is not secret is still there to read.
    assert "postgresql://onceflow:***@127.0.0.1:1/onceflow" in repr(settings)
    assert "sc://localhost:15002/;token=***" in repr(settings)
    assert "127.0.0.1:1" in repr(ref.task)
