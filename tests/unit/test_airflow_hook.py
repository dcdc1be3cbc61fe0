"""The ledger hook: Airflow connections win over ONCEFLOW_* variables, which win over the defaults."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hook_class(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    # Each test gets a copy of the process environment, restored afterwards.
    monkeypatch.setattr(os, "environ", os.environ.copy())
    sys.path.insert(0, str(ROOT / "plugins"))
    from onceflow_airflow.hooks import OnceflowHook

    return OnceflowHook


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn: dict[str, object]) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_connections_override_the_variables(hook_class, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ONCEFLOW_LEDGER_URL", "sqlite:////from/variable.db")
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP", "variable:9092")
    _conn(
        monkeypatch,
        "onceflow_ledger",
        {
            "conn_type": "postgres",
            "host": "db",
            "port": 5433,
            "login": "o f",
            "password": "p@ss",
            "schema": "ledger",
        },
    )
    _conn(
        monkeypatch,
        "onceflow_kafka",
        {"conn_type": "generic", "extra": {"bootstrap.servers": "k1:9092,k2:9092"}},
    )
    _conn(
        monkeypatch,
        "onceflow_postgres",
        {"conn_type": "postgres", "host": "pg", "login": "u", "schema": "sinks"},
    )
    before = dict(os.environ)
    settings = hook_class().settings()
    assert settings.ledger_url == "postgresql+psycopg://o%20f:p%40ss@db:5433/ledger"
    assert settings.kafka_bootstrap == "k1:9092,k2:9092"
    assert settings.pg_dsn == "postgresql://u@pg/sinks"
    # Settings travel explicitly (to sinks and to spark-submit's child environment): the task's own
    # environment is left as it was.
    assert dict(os.environ) == before


def test_a_ledger_url_in_the_extra_and_kafka_host_and_port(
    hook_class, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    _conn(monkeypatch, "other_ledger", {"conn_type": "generic", "extra": {"url": "sqlite:////data/l.db"}})
    _conn(monkeypatch, "other_kafka", {"conn_type": "generic", "host": "broker", "port": 29092})
    settings = hook_class(ledger_conn_id="other_ledger", kafka_conn_id="other_kafka").settings()
    assert settings.ledger_url == "sqlite:////data/l.db"
    assert settings.kafka_bootstrap == "broker:29092"


def test_without_connections_the_variables_are_used(hook_class, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ONCEFLOW_KAFKA_BOOTSTRAP", "variable:9092")
    monkeypatch.setenv("ONCEFLOW_LEDGER_URL", "sqlite:////from/variable.db")
    settings = hook_class(
        ledger_conn_id="absent_l", kafka_conn_id="absent_k", postgres_conn_id="absent_p"
    ).settings()
    assert (settings.kafka_bootstrap, settings.ledger_url) == ("variable:9092", "sqlite:////from/variable.db")


SECRET = f"secret-{uuid.uuid4().hex}"
TOKEN = f"token-{uuid.uuid4().hex}"


def _aws_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS variables other than any connection's, to see which of the two wins."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://variable:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "variable-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "variable-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "variable-token")


def test_the_aws_connection_gives_the_object_store_settings_and_never_shows_its_secret(
    hook_class, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from onceflow.storage.s3 import S3Settings

    _aws_variables(monkeypatch)
    _conn(
        monkeypatch,
        "aws_default",
        {
            "conn_type": "aws",
            "login": "conn-key",
            "password": SECRET,
            "extra": {
                "endpoint_url": "http://s3.local:9000",
                "region_name": "eu-north-1",
                "aws_session_token": TOKEN,
            },
        },
    )
    before = dict(os.environ)
    settings = hook_class().settings()
    assert settings.s3 == S3Settings(
        endpoint_url="http://s3.local:9000",
        region="eu-north-1",
        access_key_id="conn-key",
        secret_access_key=SECRET,
        session_token=TOKEN,
    )
    assert SECRET not in repr(settings) and TOKEN not in repr(settings)
    assert dict(os.environ) == before


def test_the_s3_endpoint_of_the_service_config_wins_and_a_login_brings_its_own_secret_and_token(
    hook_class, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    _aws_variables(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://variable-s3:9000")
    _conn(
        monkeypatch,
        "object_store",
        {
            "conn_type": "aws",
            "login": "conn-key",
            "password": SECRET,
            "extra": {
                "endpoint_url": "http://general:1",
                "service_config": {"s3": {"endpoint_url": "https://s3.x"}},
            },
        },
    )
    s3 = hook_class(aws_conn_id="object_store").settings().s3
    assert s3 is not None
    assert (s3.endpoint_url, s3.region) == ("https://s3.x", "eu-west-1")  # the region: from the variable
    assert (s3.access_key_id, s3.secret_access_key, s3.session_token) == ("conn-key", SECRET, None)


def test_without_the_aws_connection_or_its_login_the_variables_give_the_credentials(
    hook_class, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    _aws_variables(monkeypatch)
    s3 = hook_class(aws_conn_id="absent_aws").settings().s3
    assert s3 is not None
    assert (s3.endpoint_url, s3.access_key_id, s3.secret_access_key) == (
        "http://variable:9000",
        "variable-key",
        "variable-secret",
    )
    _conn(monkeypatch, "aws_default", {"conn_type": "aws", "extra": {"region_name": "ap-south-1"}})
    s3 = hook_class().settings().s3
    assert s3 is not None
    assert (s3.region, s3.access_key_id, s3.session_token) == ("ap-south-1", "variable-key", "variable-token")
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ):
        monkeypatch.delenv(name)
    assert hook_class(aws_conn_id="absent_aws").settings().s3 is None


@pytest.mark.parametrize(
    "conn",
    [
        {"conn_type": "aws", "login": "conn-key", "extra": {"aws_session_token": TOKEN}},  # no secret
        {
            "conn_type": "aws",
            "login": "conn-key",
            "password": SECRET,
            "extra": {"endpoint_url": "s3.local:9000"},
        },
        {
            "conn_type": "aws",
            "login": "conn-key",
            "password": SECRET,
            "extra": {"endpoint_url": f"ftp://conn-key:{SECRET}@s3.local"},
        },
    ],
    ids=["login-without-password", "endpoint-without-scheme", "endpoint-with-the-secret"],
)
def test_a_bad_aws_connection_is_refused_without_showing_its_secret(
    hook_class, monkeypatch: pytest.MonkeyPatch, conn: dict[str, object]
) -> None:  # type: ignore[no-untyped-def]
    from onceflow.errors import ConfigError

    _aws_variables(monkeypatch)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # what a connection's login must not be paired with
    _conn(monkeypatch, "aws_default", conn)
    with pytest.raises(ConfigError) as refused:
        hook_class().settings()
    assert "AWS_" in str(refused.value)
    assert SECRET not in str(refused.value) and TOKEN not in str(refused.value)
