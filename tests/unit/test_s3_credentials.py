"""The object store's credentials reach only the sinks that stage in a bucket, and never a message: a
sink config built from settings that hold them carries them only when it names an ``s3://`` path, a
refused setting of such a sink is said without them (the write-ahead log, local only, refuses a bucket
in one line), and a shown config masks them."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from onceflow import redact
from onceflow.config import Settings
from onceflow.errors import ConfigError
from onceflow.pipeline import SinkSpec
from onceflow.sinks import sink_kind

KEY = f"AKIA{uuid.uuid4().hex[:16].upper()}"
SECRET = f"secret-{uuid.uuid4().hex}"
TOKEN = f"token-{uuid.uuid4().hex}"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env(
        {
            "ONCEFLOW_HOME": str(tmp_path),
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_SESSION_TOKEN": TOKEN,
        }
    )


def kafka_config(settings: Settings, staging_root: str, **more: Any) -> dict[str, Any]:
    spec = SinkSpec("out", "kafka", {"topic": "t", "staging_root": staging_root, **more})
    return sink_kind("kafka").config_for(spec, settings)


def files_config(settings: Settings, root: str) -> dict[str, Any]:
    spec = SinkSpec("table", "files", {"root": root, "table": "events"})
    return sink_kind("files").config_for(spec, settings)


def test_only_a_sink_that_names_a_bucket_gets_the_credentials(settings: Settings, tmp_path: Path) -> None:
    assert settings.s3 is not None
    assert "s3" not in kafka_config(settings, str(tmp_path / "staging"))
    assert "s3" not in files_config(settings, str(tmp_path / "table"))
    staged_in_a_bucket = kafka_config(settings, "s3://bucket/staging")
    assert staged_in_a_bucket["s3"] == settings.s3.to_config()
    committer = sink_kind("kafka").build_committer(staged_in_a_bucket)
    assert committer.config.s3 == settings.s3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"partition": -3}, "partition"),
        ({"timeout_s": "soon"}, "timeout_s"),
        ({"staging_rooot": "s3://bucket/typo"}, "staging_rooot"),
        ({"staging_root": "s3:///no-bucket"}, "staging_root"),
        ({"s3": {"access_key_id": KEY, "secret_access_key": 5}}, "secret_access_key"),
        ({"s3": {"access_key_id": KEY, "secret_access_key": SECRET, "region": ""}}, "region"),
        (
            {"s3": {"endpoint_url": f"ftp://{KEY}:{SECRET}@store", "secret_access_key": SECRET}},
            "endpoint_url",
        ),
        ({"s3": {"access_key_id": KEY}}, "AWS_SECRET_ACCESS_KEY"),
        ({"s3": {"secret_access_key": SECRET, "token": TOKEN}}, "token"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else v,
)
def test_a_refused_setting_of_a_sink_staged_in_a_bucket_is_said_without_the_secret(
    settings: Settings, change: dict[str, Any], named: str
) -> None:
    config = {**kafka_config(settings, "s3://bucket/staging"), **change}
    with pytest.raises(ConfigError, match=named) as refused:
        sink_kind("kafka").build_committer(config)
    assert SECRET not in str(refused.value)
    assert TOKEN not in str(refused.value)


def test_a_shown_config_masks_the_credentials(settings: Settings) -> None:
    config = kafka_config(settings, "s3://bucket/staging")
    shown = redact.mapping(config)
    assert shown["s3"]["access_key_id"] == redact.MASK
    assert shown["s3"]["secret_access_key"] == redact.MASK
    assert shown["s3"]["session_token"] == redact.MASK
    assert shown["s3"]["endpoint_url"] == "http://127.0.0.1:9000"
    assert shown["staging_root"] == "s3://bucket/staging"
    assert KEY not in str(shown) and SECRET not in str(shown) and TOKEN not in str(shown)
    assert SECRET not in repr(sink_kind("kafka").build_committer(config).config)  # type: ignore[attr-defined]


def test_the_write_ahead_log_refuses_a_bucket_in_one_line(settings: Settings) -> None:
    spec = SinkSpec("log", "wal", {"root": "s3://bucket/logs", "table": "t", "columns": {"id": "bigint"}})
    config = sink_kind("wal").config_for(spec, settings)
    assert "s3" in config  # it names a bucket, so it got the credentials: it must not show them
    with pytest.raises(ConfigError, match="local folder only") as refused:
        sink_kind("wal").build_writer(config)
    assert SECRET not in str(refused.value) and "\n" not in str(refused.value)
