"""Fixtures shared by every test: the real local stack that `make test` starts.

Integration tests never skip when a service is missing: they fail and say how to start it, because a
skipped integration test proves nothing. The one exception is the schema registry where no Java 21+ can
run it (`make services` leaves it out there, in one line): its tests skip with that line.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from onceflow.cli.topics import wait_for_leaders
from onceflow.config import Settings
from onceflow.decoding.schema_registry import HttpSchemaRegistry, RegistryUnavailable


def _use_this_lanes_stack() -> None:
    """`make test` runs the integration and fault tests in lanes (pytest-xdist workers gw0, gw1, ...),
    each against a whole stack of its own (infra/test-stacks.sh), so that one lane's faults (a broker
    killed, PostgreSQL restarted, the Spark runtime killed) never reach another lane's tests. A worker
    takes its stack's settings from the n-th file of ONCEFLOW_TEST_STACKS before anything reads them:
    the fixtures, the spark-submit children and the infra scripts the fault tests call all see them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    files = os.environ.get("ONCEFLOW_TEST_STACKS", "").split()
    if not worker.startswith("gw") or not files:
        return
    chosen = Path(files[int(worker.removeprefix("gw")) % len(files)])
    for line in chosen.read_text().splitlines():
        for word in shlex.split(line):
            key, _, value = word.partition("=")
            os.environ[key] = value


_use_this_lanes_stack()


ROOT = Path(__file__).resolve().parent.parent

# The suite's Spark drivers (spark-submit slices, local sessions) live for seconds and read little: the
# client JIT and the serial collector start them about a quarter faster on two cores, which the
# suite's many spark-submits add up to minutes of. What runs is the same; a caller's own value wins.
# (The warm runtime's server takes its options from infra/spark.sh alone.)
_FAST_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_OWN_SUBMIT_OPTS = "SPARK_SUBMIT_OPTS" in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", _FAST_START)


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> None:
    """Spark drivers that map their classes from one archive (the JVM's class-data sharing) instead of
    loading them from the jars: a spark-submit starts about 3 s sooner (8.8 s to 5.9 s on two cores),
    and the suite runs dozens. One training spark-submit writes the archive on the first integration
    run, into .cache/ beside the jars. A JVM that cannot use it (another Java, another class path) loads
    its classes as before, silently. Skipped for the unit tests and when SPARK_SUBMIT_OPTS was given."""
    if _OWN_SUBMIT_OPTS or "ONCEFLOW_PG_DSN" not in os.environ:
        return
    from pyspark import __version__ as spark_version

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr
    cache = Path(os.environ.get("ONCEFLOW_CACHE") or ROOT / ".cache")
    key = uuid.uuid5(uuid.NAMESPACE_OID, java).hex[:12]
    archive = cache / f"spark-submit-classes-{spark_version}-{key}.jsa"
    cache.mkdir(parents=True, exist_ok=True)
    with open(archive.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one lane trains, the others wait for its archive
        if not archive.exists() and not _train(archive):
            return
    os.environ["SPARK_SUBMIT_OPTS"] = f"{_FAST_START} -XX:SharedArchiveFile={archive} -Xlog:cds*=off"


def _train(archive: Path) -> bool:
    """Write ``archive`` from one spark-submit of tests/spark_classes.py; False (said in one line) if
    that job fails."""
    from onceflow.engine.submit import spark_environment

    partial = archive.with_suffix(f".{os.getpid()}.part")
    env = spark_environment(Settings.from_env())
    env["SPARK_SUBMIT_OPTS"] = f"{_FAST_START} -XX:ArchiveClassesAtExit={partial}"
    job = ROOT / "tests" / "spark_classes.py"
    done = subprocess.run(
        ["spark-submit", "--master", "local[2]", str(job)], env=env, capture_output=True, timeout=300
    )
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        print(f"no class archive for spark-submit (exit {done.returncode}); drivers load their jars")
        return False
    partial.replace(archive)
    return True


@pytest.fixture(scope="session")
def settings() -> Settings:
    missing = [k for k in ("ONCEFLOW_KAFKA_BOOTSTRAP", "ONCEFLOW_PG_DSN") if k not in os.environ]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not set: run the suite with `make test`, or "
            '`eval "$(make -s services)"` first',
            pytrace=False,
        )
    return Settings.from_env()


@pytest.fixture(scope="session")
def schema_registry(settings: Settings) -> HttpSchemaRegistry:
    """The stack's schema registry server (ONCEFLOW_SCHEMA_REGISTRY_URL), checked to answer."""
    url = settings.schema_registry_url
    if url is None:
        usable = subprocess.run(
            ["bash", str(ROOT / "infra" / "registry.sh"), "usable"], capture_output=True, text=True
        )
        if usable.returncode != 0:  # no Java 21+ on this machine: `make services` left the registry out
            pytest.skip(usable.stderr.strip().removeprefix("[onceflow] "))
        pytest.fail(
            "ONCEFLOW_SCHEMA_REGISTRY_URL not set: run the suite with `make test`, or "
            '`eval "$(make -s services)"` first',
            pytrace=False,
        )
    if not url.startswith(("http://", "https://")):
        pytest.fail(
            f"ONCEFLOW_SCHEMA_REGISTRY_URL is {url!r}: these tests need a registry server", pytrace=False
        )
    registry = HttpSchemaRegistry(
        url, timeout_s=5, allow_insecure_auth=settings.schema_registry_allow_insecure_auth
    )
    try:
        registry.subjects()
        return registry
    except RegistryUnavailable as exc:
        problem = str(exc)  # failed outside the handler: one line, without the exception chain
    pytest.fail(f"{problem}; start it with `make services` (or infra/registry.sh start)", pytrace=False)


@pytest.fixture(scope="session")
def kafka_admin(settings: Settings):  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    try:
        admin.list_topics(timeout=15)
    except Exception as exc:  # pragma: no cover - environment problem
        pytest.fail(f"Kafka at {settings.kafka_bootstrap} does not answer ({exc}); run `make services`")
    return admin


@pytest.fixture
def make_topic(kafka_admin) -> Iterator[Callable[..., str]]:  # type: ignore[no-untyped-def]
    """Create uniquely named topics for one test; deleted afterwards."""
    from confluent_kafka.admin import NewTopic

    created: list[str] = []

    def make(prefix: str = "t", partitions: int = 1, **config: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        futures = kafka_admin.create_topics(
            [NewTopic(name, num_partitions=partitions, config=config)]  # replicas: the cluster default
        )
        futures[name].result(timeout=30)
        created.append(name)
        wait_for_leaders(kafka_admin, name, partitions, timeout_s=30)
        return name

    yield make
    if created:
        for future in kafka_admin.delete_topics(created).values():
            with contextlib.suppress(Exception):  # a test may have deleted it already
                future.result(timeout=30)


@pytest.fixture
def pg_connect(settings: Settings) -> Iterator[Callable[..., object]]:
    """Open psycopg connections to the stack's database; all closed afterwards."""
    import psycopg

    conns: list[psycopg.Connection[object]] = []

    def connect(**kwargs: object) -> psycopg.Connection[object]:
        conn = psycopg.connect(settings.pg_dsn, **kwargs)  # type: ignore[arg-type]
        conns.append(conn)
        return conn

    yield connect
    for conn in conns:
        conn.close()


@pytest.fixture
def pg_database(settings: Settings) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (dropped afterwards); yields its DSN."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = settings.pg_dsn.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def spark_env(settings: Settings) -> dict[str, str]:
    """Environment for spark-submit child processes: the venv's Python on executors, ONCEFLOW_* settings."""
    from onceflow.engine.submit import spark_environment

    return spark_environment(settings)


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> dict[str, str]:
    """An Airflow home with a migrated metadata DB, the repo's dags/ and a local Spark connection."""
    from local_stack.local_airflow import airflow_environment, migrate

    env = airflow_environment(settings, ROOT, tmp_path_factory.mktemp("airflow-home"))
    migrate(env)
    return env


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first: `make test`'s lanes take whole files in this order as they come free,
    so a fault test or a slow one started last would leave the other lane idle for minutes. Faults,
    then the other slow tests, then the rest, each kept in its collected order (a stable sort)."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("faults") is not None:
            return 0
        return 1 if item.get_closest_marker("slow") is not None else 2

    items.sort(key=rank)
