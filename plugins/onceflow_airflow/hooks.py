"""Where the services are, from Airflow connections, with the ONCEFLOW_* variables as the fallback.

Connections (all optional; a missing one falls back to its variable, then to the local stack):

* ``onceflow_ledger``: the ledger. Put the SQLAlchemy URL in the extra ``url``
  (``{"url": "sqlite:////data/ledger.db"}``), or use a ``postgres`` connection (host, port, login,
  password, schema = database), which becomes ``postgresql+psycopg://...``. Fallback ONCEFLOW_LEDGER_URL.
* ``onceflow_kafka``: Kafka. The extra ``bootstrap.servers`` (``host:port[,host:port]``), or host and
  port. Fallback ONCEFLOW_KAFKA_BOOTSTRAP.
* ``onceflow_postgres``: the PostgreSQL the sinks write to by default (``postgres`` connection).
  Fallback ONCEFLOW_PG_DSN.
* ``aws_default``: the object store of the sinks whose path is an ``s3://`` URL, as the Amazon
  provider's ``aws`` connection holds it: login = access key id, password = secret access key, extra
  ``endpoint_url`` (or ``service_config: {s3: {endpoint_url}}``, which wins), ``region_name`` and
  ``aws_session_token``. A connection with a login brings its own secret and token (none is taken from
  the variables to pair with it); one without uses the variables' credentials, or the AWS SDK's chain.
  Fallback AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION, AWS_SESSION_TOKEN.

Spark is reached through the apache-spark provider's own connection (``spark_default``).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from onceflow import redact
from onceflow.config import Settings
from onceflow.ledger import Ledger


def _aws_environment(conn: Any, env: dict[str, str]) -> None:
    """Put an ``aws`` connection's settings into ``env`` as the AWS variables `Settings` reads."""
    extra = conn.extra_dejson
    service = extra.get("service_config")
    s3_config = service.get("s3") if isinstance(service, dict) else None
    endpoint = (s3_config.get("endpoint_url") if isinstance(s3_config, dict) else None) or extra.get(
        "endpoint_url"
    )
    if endpoint:
        env.pop("AWS_ENDPOINT_URL_S3", None)  # it would win over the connection's endpoint
        env["AWS_ENDPOINT_URL"] = str(endpoint)
    if extra.get("region_name"):
        env["AWS_REGION"] = str(extra["region_name"])
    if conn.login:
        env["AWS_ACCESS_KEY_ID"] = conn.login
        for name, value in (
            ("AWS_SECRET_ACCESS_KEY", conn.password),
            ("AWS_SESSION_TOKEN", extra.get("aws_session_token")),
        ):
            if value:
                env[name] = str(value)
            else:
                env.pop(name, None)


def _postgres_url(conn: Any, driver: str) -> str:
    auth = ""
    if conn.login:
        auth = quote(conn.login, safe="")
        if conn.password:
            auth += ":" + quote(conn.password, safe="")
        auth += "@"
    port = f":{conn.port}" if conn.port else ""
    return f"{driver}://{auth}{conn.host or 'localhost'}{port}/{conn.schema or ''}"


class OnceflowHook(BaseHook):
    """Builds onceflow `Settings` from the connections above and opens the ledger.

    Settings are passed on explicitly (to the coordinator, to sinks through their kinds' defaults, to
    spark-submit as its child environment); this process's environment is never written.
    """

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "onceflow_ledger"
    conn_type = "generic"
    hook_name = "onceflow ledger"

    def __init__(
        self,
        ledger_conn_id: str = "onceflow_ledger",
        kafka_conn_id: str = "onceflow_kafka",
        postgres_conn_id: str = "onceflow_postgres",
        aws_conn_id: str = "aws_default",
    ) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    def _connection(self, conn_id: str) -> Any | None:
        try:
            return self.get_connection(conn_id)
        except AirflowNotFoundException:
            return None

    def settings(self) -> Settings:
        """Connections first, then ONCEFLOW_* variables, then the local stack's defaults."""
        env = dict(os.environ)
        ledger = self._connection(self.ledger_conn_id)
        if ledger is not None:
            url = ledger.extra_dejson.get("url")
            env["ONCEFLOW_LEDGER_URL"] = url or _postgres_url(ledger, "postgresql+psycopg")
        kafka = self._connection(self.kafka_conn_id)
        if kafka is not None:
            servers = kafka.extra_dejson.get("bootstrap.servers")
            env["ONCEFLOW_KAFKA_BOOTSTRAP"] = servers or f"{kafka.host}:{kafka.port or 9092}"
        postgres = self._connection(self.postgres_conn_id)
        if postgres is not None:
            env["ONCEFLOW_PG_DSN"] = _postgres_url(postgres, "postgresql")
        aws = self._connection(self.aws_conn_id)
        if aws is not None:
            _aws_environment(aws, env)
        settings = Settings.from_env(env)
        shown = redact.url(settings.ledger_url)  # SQLAlchemy's hiding misses ?password= and a raw '@'
        self.log.info("onceflow: ledger %s, Kafka %s", shown, settings.kafka_bootstrap)
        return settings

    def get_conn(self) -> Ledger:
        return Ledger.connect(self.settings().ledger_url)
