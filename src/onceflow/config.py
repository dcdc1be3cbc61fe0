"""Connection settings, read from the same ONCEFLOW_* variables that `make services` prints.

Every onceflow command, DAG and Spark job goes through `Settings.from_env()` at its door (the CLI, the
spark-submit entry, the Airflow hook), so pointing onceflow at another Kafka, PostgreSQL, ledger or Spark
is a matter of setting these variables (or Airflow connections, which the plugins translate into the
same settings). This is the one module that reads them: the library below the doors takes a `Settings`
and never looks at the environment (only the fault-injection and debug switches of `onceflow.faults`
and `onceflow.errors` are read where they act).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias, cast

from onceflow import redact
from onceflow.errors import ConfigError
from onceflow.storage.s3 import S3Settings

_DEFAULT_HOME = Path.cwd() / ".onceflow"
# How slices run: "spark" is the Spark Connect server when one is configured, else spark-submit;
# "connect" and "submit" insist on one of them; "local" runs them in the driver's process, without Spark.
Executor: TypeAlias = Literal["spark", "connect", "submit", "local"]
EXECUTORS: tuple[Executor, ...] = ("spark", "connect", "submit", "local")
# How a Spark slice reads and decodes JSON records: "python" in each task's Python worker (a Kafka
# consumer per read task, one parse per record), "jvm" with Spark's Kafka source and from_json (what the
# JVM cannot prove good still goes to Python). docs/operations.md (Read paths) has the two side by side.
JsonRead: TypeAlias = Literal["python", "jvm"]
JSON_READS: tuple[JsonRead, ...] = ("python", "jvm")
_REGISTRY_SCHEMES = ("http://", "https://", "file:///")
# The metadata of a field whose value may hold a password or a token: shown through `redact.url` only.
SECRET = {"secret": True}


@dataclass(frozen=True, repr=False)
class Settings:
    """Where the services are. Values are plain strings so they pass unchanged to subprocesses.

    The fields marked `SECRET` are shown without their passwords and tokens by ``repr`` (and so by any
    log line or traceback that prints the settings); `as_env` alone gives them whole, to child processes.
    """

    home: Path
    kafka_bootstrap: str
    pg_dsn: str = field(metadata=SECRET)
    ledger_url: str = field(metadata=SECRET)
    # How long an epoch's owner counts as alive without renewing its lease (ONCEFLOW_LEASE_S).
    lease_s: float = 120.0
    # Committed epochs each pipeline keeps in the ledger; every retain_epochs/10 epochs a commit deletes
    # older history that no step needs (ONCEFLOW_RETAIN_EPOCHS; 0 turns that off, `onceflow retain` works).
    retain_epochs: int = 1000
    # Days after which dead letters of finished epochs are deleted (ONCEFLOW_DEAD_LETTER_DAYS).
    dead_letter_days: float = 7.0
    # The folder of the spark-submit entry points (ONCEFLOW_SPARK_JOBS); None: beside the code, if there.
    spark_jobs: Path | None = None
    # The master of `onceflow run`'s spark-submit (ONCEFLOW_SPARK_MASTER; DAGs use `spark_default`).
    spark_master: str = "local[2]"
    # sc://host:port of a Spark Connect server that runs the slices (ONCEFLOW_SPARK_REMOTE), or None.
    spark_remote: str | None = field(default=None, metadata=SECRET)
    # How slices run (ONCEFLOW_EXECUTOR), see `Executor`; `onceflow run --executor` overrides it.
    executor: Executor = "spark"
    # module:attribute of each pipeline the CLI and the console find by name (ONCEFLOW_PIPELINES).
    pipelines: tuple[str, ...] = ()
    # Where Avro formats find writer schemas by id and subjects' latest schemas
    # (ONCEFLOW_SCHEMA_REGISTRY_URL): http(s):// for a registry server, file:///folder for a folder of
    # schemas (`onceflow.decoding.schema_registry`), or None.
    schema_registry_url: str | None = field(default=None, metadata=SECRET)
    # Whether the registry URL's credentials may go over plain http, in clear text
    # (ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH=true); without it such a URL is refused.
    schema_registry_allow_insecure_auth: bool = False
    # Which path reads JSON records in a Spark slice (ONCEFLOW_JSON_READ), see `JsonRead`.
    json_read: JsonRead = "python"
    # Object storage for sinks whose path is an s3:// URL (the AWS_* variables: AWS_ENDPOINT_URL,
    # AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), or None when none is set.
    s3: S3Settings | None = None

    def __repr__(self) -> str:
        return redact.dataclass_repr(self, redact.url)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        home = Path(env.get("ONCEFLOW_HOME") or _DEFAULT_HOME)
        settings = cls(
            home=home,
            kafka_bootstrap=env.get("ONCEFLOW_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
            pg_dsn=env.get("ONCEFLOW_PG_DSN", "postgresql://onceflow:onceflow@127.0.0.1:15432/onceflow"),
            ledger_url=env.get("ONCEFLOW_LEDGER_URL") or f"sqlite:///{home / 'ledger.db'}",
            lease_s=_seconds(env.get("ONCEFLOW_LEASE_S"), "ONCEFLOW_LEASE_S", 120.0),
            retain_epochs=_whole(env.get("ONCEFLOW_RETAIN_EPOCHS"), "ONCEFLOW_RETAIN_EPOCHS", 1000),
            dead_letter_days=_days(env.get("ONCEFLOW_DEAD_LETTER_DAYS"), "ONCEFLOW_DEAD_LETTER_DAYS", 7.0),
            spark_jobs=Path(jobs) if (jobs := env.get("ONCEFLOW_SPARK_JOBS", "").strip()) else None,
            spark_master=env.get("ONCEFLOW_SPARK_MASTER", "").strip() or "local[2]",
            spark_remote=env.get("ONCEFLOW_SPARK_REMOTE", "").strip() or None,
            executor=cast(Executor, env.get("ONCEFLOW_EXECUTOR", "").strip() or "spark"),
            pipelines=tuple(p.strip() for p in env.get("ONCEFLOW_PIPELINES", "").split(",") if p.strip()),
            schema_registry_url=env.get("ONCEFLOW_SCHEMA_REGISTRY_URL", "").strip() or None,
            schema_registry_allow_insecure_auth=_flag(
                env.get("ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH"),
                "ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH",
            ),
            json_read=cast(JsonRead, env.get("ONCEFLOW_JSON_READ", "").strip() or "python"),
            s3=S3Settings.from_env(env),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        """Reject values that cannot work, naming the variable, before anything connects."""
        for host_port in self.kafka_bootstrap.split(","):
            host, sep, port = host_port.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(
                    f"ONCEFLOW_KAFKA_BOOTSTRAP={self.kafka_bootstrap!r}: expected host:port[,host:port...]"
                )
        if not self.pg_dsn.startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"ONCEFLOW_PG_DSN={redact.url(self.pg_dsn)!r}: expected a postgresql:// URL")
        if "://" not in self.ledger_url:
            raise ConfigError(
                f"ONCEFLOW_LEDGER_URL={redact.url(self.ledger_url)!r}: expected an SQLAlchemy URL such as "
                "sqlite:///path/ledger.db or postgresql+psycopg://user:pw@host/db"
            )
        for name, url in (("ONCEFLOW_PG_DSN", self.pg_dsn), ("ONCEFLOW_LEDGER_URL", self.ledger_url)):
            if _raw_at(url):  # libpq and SQLAlchemy would take the password's tail for the host name
                raise ConfigError(
                    f"{name}={redact.url(url)!r}: its password holds a raw '@': write it as %40"
                )
        if self.spark_remote is not None and not self.spark_remote.startswith("sc://"):
            raise ConfigError(
                f"ONCEFLOW_SPARK_REMOTE={redact.url(self.spark_remote)!r} is not a Spark Connect URL: use "
                "sc://host:port (infra/spark.sh start prints the local one)"
            )
        if self.executor not in EXECUTORS:
            raise ConfigError(f"ONCEFLOW_EXECUTOR={self.executor!r}: expected one of {', '.join(EXECUTORS)}")
        if self.json_read not in JSON_READS:
            raise ConfigError(f"ONCEFLOW_JSON_READ={self.json_read!r}: expected {' or '.join(JSON_READS)}")
        if self.schema_registry_url is not None and not self.schema_registry_url.startswith(
            _REGISTRY_SCHEMES
        ):
            raise ConfigError(
                f"ONCEFLOW_SCHEMA_REGISTRY_URL={redact.url(self.schema_registry_url)!r}: expected http(s)://"
                "host[:port][/path] of a schema registry, or file:///folder of schemas"
            )
        if (
            self.schema_registry_url is not None
            and _credentials_over_http(self.schema_registry_url)
            and not self.schema_registry_allow_insecure_auth
        ):
            raise ConfigError(
                f"ONCEFLOW_SCHEMA_REGISTRY_URL={redact.url(self.schema_registry_url)!r}: its credentials "
                "would travel in clear text over plain http: use https, or set "
                "ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH=true"
            )
        for path in self.pipelines:
            module, sep, attribute = path.partition(":")
            if not sep or not module or not attribute:
                raise ConfigError(
                    f"ONCEFLOW_PIPELINES={','.join(self.pipelines)!r}: {path!r} is not module:attribute"
                )

    def as_env(self) -> dict[str, str]:
        """The settings as ONCEFLOW_* variables, for spark-submit and other child processes."""
        return {
            "ONCEFLOW_HOME": str(self.home),
            "ONCEFLOW_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "ONCEFLOW_PG_DSN": self.pg_dsn,
            "ONCEFLOW_LEDGER_URL": self.ledger_url,
            "ONCEFLOW_LEASE_S": f"{self.lease_s:g}",
            "ONCEFLOW_RETAIN_EPOCHS": str(self.retain_epochs),
            "ONCEFLOW_DEAD_LETTER_DAYS": f"{self.dead_letter_days:g}",
            "ONCEFLOW_SPARK_MASTER": self.spark_master,
            "ONCEFLOW_EXECUTOR": self.executor,
            "ONCEFLOW_JSON_READ": self.json_read,
            **({} if self.spark_jobs is None else {"ONCEFLOW_SPARK_JOBS": str(self.spark_jobs)}),
            **({} if self.spark_remote is None else {"ONCEFLOW_SPARK_REMOTE": self.spark_remote}),
            **({"ONCEFLOW_PIPELINES": ",".join(self.pipelines)} if self.pipelines else {}),
            **(
                {}
                if self.schema_registry_url is None
                else {"ONCEFLOW_SCHEMA_REGISTRY_URL": self.schema_registry_url}
            ),
            **(
                {"ONCEFLOW_SCHEMA_REGISTRY_ALLOW_INSECURE_AUTH": "true"}
                if self.schema_registry_allow_insecure_auth
                else {}
            ),
            **(self._s3_env() if self.s3 is not None else {}),
        }

    def _s3_env(self) -> dict[str, str]:
        assert self.s3 is not None
        names = {
            "endpoint_url": "AWS_ENDPOINT_URL",
            "region": "AWS_REGION",
            "access_key_id": "AWS_ACCESS_KEY_ID",
            "secret_access_key": "AWS_SECRET_ACCESS_KEY",
            "session_token": "AWS_SESSION_TOKEN",
        }
        return {names[key]: value for key, value in self.s3.to_config().items()}


def inherited_environment() -> dict[str, str]:
    """This process's whole environment, for a child process that must inherit it (spark-submit needs
    PATH, JAVA_HOME, SPARK_HOME and the rest); onceflow itself reads only `Settings`."""
    return dict(os.environ)


def python_daemon_idle_s(default: float) -> float:
    """How long the runtime's Python daemon (`onceflow.engine.python_daemon`) stays without a worker
    before it exits: ONCEFLOW_PYTHON_DAEMON_IDLE_S in the executors' environment (set with
    ``spark.executorEnv.``), read there, where no `Settings` is made."""
    name = "ONCEFLOW_PYTHON_DAEMON_IDLE_S"
    return _seconds(os.environ.get(name), name, default)


def _seconds(value: str | None, name: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ConfigError(f"{name}={value!r}: expected a positive number of seconds")
    return seconds


def _raw_at(url: str) -> bool:
    """Whether the authority of ``url`` holds more than one ``@``: an unencoded one in the password."""
    authority = url.partition("://")[2]
    for end in "/?#":
        authority = authority.partition(end)[0]
    return authority.count("@") > 1


def _credentials_over_http(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and parts.username is not None


def _flag(value: str | None, name: str) -> bool:
    """A yes/no variable: unset, empty, ``false`` (``0``, ``no``, ``off``) or ``true`` (``1``, ``yes``,
    ``on``)."""
    shown = (value or "").strip().lower()
    if shown in ("", "false", "0", "no", "off"):
        return False
    if shown in ("true", "1", "yes", "on"):
        return True
    raise ConfigError(f"{name}={value!r}: expected true or false")


def _whole(value: str | None, name: str, default: int) -> int:
    if value is None or value == "":
        return default
    if not value.strip().isdigit():
        raise ConfigError(f"{name}={value!r}: expected a whole number >= 0")
    return int(value)


def _days(value: str | None, name: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        days = float(value)
    except ValueError:
        days = -1.0
    if not days >= 0:
        raise ConfigError(f"{name}={value!r}: expected a number of days >= 0")
    return days
