"""docker-compose.yml cannot be run here (no Docker engine), so check it statically against the repo."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_SERVICES = {"airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}
# The interface compose publishes ports on: a container matter, the local scripts bind loopback anyway.
COMPOSE_ONLY = {"ONCEFLOW_BIND"}
# The Airflow containers' Spark Connect remote: a setting onceflow reads, not one of the local scripts'.
COMPOSE_ONLY |= {"ONCEFLOW_SPARK_REMOTE"}
# What compose refuses to start without, unless the local profile's env file gives it.
SECRETS = {
    "ONCEFLOW_PG_PASSWORD",
    "AIRFLOW_ADMIN_PASSWORD",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_FERNET_KEY",
    "AIRFLOW_API_SECRET_KEY",
    "SPARK_CONNECT_AUTHENTICATE_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
}
LOCAL_ENV = ROOT / "docker" / "local.env"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env_sh_variables() -> set[str]:
    text = (ROOT / "infra" / "env.sh").read_text()
    return set(re.findall(r"^export (ONCEFLOW_[A-Z0-9_]+)=", text, flags=re.MULTILINE))


def _local_broker_config(brokers: int = 1, node: int = 1) -> dict[str, str]:
    """server.properties exactly as infra/kafka.sh writes it for broker NODE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    env["ONCEFLOW_KAFKA_BROKERS"] = str(brokers)
    script = ROOT / "infra" / "kafka.sh"
    out = subprocess.run(
        ["bash", str(script), "config", str(node)], env=env, capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if line and not line.startswith("#"))


# Where a container and a local process run the same broker, only these settings may differ.
TOPOLOGY = {"node.id", "controller.quorum.voters", "listeners", "advertised.listeners", "log.dirs"}
TOPOLOGY |= {"listener.security.protocol.map"}  # compose adds a HOST listener for clients outside


def _broker_settings(env: dict[str, Any]) -> dict[str, str]:
    """The broker properties a compose environment gives: the image maps ``KAFKA_A_B`` to ``a.b``."""
    return {k[6:].lower().replace("_", "."): str(v) for k, v in env.items() if k.startswith("KAFKA_")}


def _shared(settings: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in settings.items() if k not in TOPOLOGY}


def test_topology_has_every_service(compose) -> None:
    services = set(compose["services"])
    expected = {"kafka", "postgres", "registry", "spark-master", "spark-worker", "connect", "connect-plugins"}
    assert expected | AIRFLOW_SERVICES <= services


def test_bind_mounts_and_build_files_exist(compose) -> None:
    declared_volumes = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: mounted path {source} does not exist"
            else:
                assert source in declared_volumes, f"{name}: named volume {source} is not declared"
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), f"{name}: missing Dockerfile"
        for dependency in service.get("depends_on", []):
            assert dependency in compose["services"], f"{name} depends on unknown service {dependency}"


def test_airflow_mounts_dags_plugins_and_spark_jobs(compose) -> None:
    for name in AIRFLOW_SERVICES:
        mounted = {v.split(":")[0] for v in compose["services"][name]["volumes"]}
        assert {"./dags", "./plugins", "./spark_jobs"} <= mounted, name


def test_dockerfiles_copy_only_existing_paths() -> None:
    for dockerfile in (ROOT / "docker").glob("*.Dockerfile"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                sources = [p for p in line.split()[1:-1] if not p.startswith("--")]
                for source in sources:
                    assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"


def test_same_variable_names_as_the_local_scripts(compose) -> None:
    local = _env_sh_variables()
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\b(ONCEFLOW_[A-Z0-9_]+)\b", text)) - COMPOSE_ONLY
    assert used <= local, f"compose uses variables the local scripts do not define: {used - local}"
    onceflow_env = compose["x-onceflow-env"]
    assert {"ONCEFLOW_KAFKA_BOOTSTRAP", "ONCEFLOW_PG_DSN", "ONCEFLOW_LEDGER_URL"} <= set(onceflow_env)


def test_kafka_and_postgres_settings_match_what_exactly_once_needs(compose) -> None:
    kafka = compose["services"]["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert int(kafka["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"]) == 1
    assert int(kafka["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == 1
    cluster = _local_broker_config(brokers=3)
    assert cluster["transaction.state.log.replication.factor"] == "3"
    assert cluster["transaction.state.log.min.isr"] == cluster["min.insync.replicas"] == "2"
    assert _shared(_broker_settings(kafka)) == _shared(_local_broker_config())

    command = " ".join(compose["services"]["postgres"]["command"])
    match = re.search(r"max_prepared_transactions=\$\{ONCEFLOW_PG_MAX_PREPARED:-(\d+)\}", command)
    assert match and int(match.group(1)) >= 64
    assert f"ONCEFLOW_PG_MAX_PREPARED:-{match.group(1)}" in (ROOT / "infra" / "env.sh").read_text()


def test_default_ports_match_the_local_scripts(compose) -> None:
    env_sh = (ROOT / "infra" / "env.sh").read_text()
    kafka_port = re.search(r"ONCEFLOW_KAFKA_PORT:-(\d+)", env_sh).group(1)
    pg_port = re.search(r"ONCEFLOW_PG_PORT:-(\d+)", env_sh).group(1)
    assert f"${{ONCEFLOW_KAFKA_PORT:-{kafka_port}}}" in compose["services"]["kafka"]["ports"][0]
    assert f"${{ONCEFLOW_PG_PORT:-{pg_port}}}:5432" in compose["services"]["postgres"]["ports"][0]


# ---------------------------------------------------------------------------------------------------
# The compose file as `docker compose config` renders it: anchors and merge keys resolved (YAML), then
# every string interpolated the way compose does it, against a given environment.

_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's rules: ``$$`` is ``$``; ``${V:-d}`` d when V is unset or empty, ``${V-d}`` only when unset;
    ``${V:?e}``/``${V?e}`` an error; ``${V:+a}``/``${V+a}`` a when V is set (and non-empty)."""

    def one(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        value = env.get(name)
        present = value is not None and (value != "" or not (op or "").startswith(":"))
        if op in (":-", "-"):
            return value if present else arg  # type: ignore[return-value]
        if op in (":?", "?"):
            if not present:
                raise ValueError(f"required variable {name} is missing: {arg}")
            return value  # type: ignore[return-value]
        if op in (":+", "+"):
            return arg if present else ""
        return value or ""

    return _INTERPOLATION.sub(one, text)


def local_env() -> dict[str, str]:
    """The local profile: docker/local.env as ``docker compose --env-file`` reads it."""
    lines = LOCAL_ENV.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def render(env: dict[str, str] | None = None, *, local: bool = True) -> dict[str, Any]:
    """docker-compose.yml rendered against ``env``, over the local profile's values if ``local``."""
    env = {**(local_env() if local else {}), **(env or {})}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value) for value in node]
        return interpolate(node, env) if isinstance(node, str) else node

    return walk(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def _env_sh_defaults() -> dict[str, str]:
    """``VAR`` -> its literal default in infra/env.sh (``export VAR="${VAR:-default}"``)."""
    text = (ROOT / "infra" / "env.sh").read_text()
    return dict(re.findall(r'^export (ONCEFLOW_[A-Z0-9_]+)="\$\{\1:-([^$"}]*)\}"', text, flags=re.MULTILINE))


def _airflow_containers(rendered: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in rendered["services"].items()
        if service.get("image") == "onceflow/airflow:local"
    }


def _depends_on(service: dict[str, Any]) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def _waits_for(rendered: dict[str, Any], name: str, target: str) -> bool:
    """Whether service NAME starts only after TARGET completed successfully (directly or through others)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for dep, condition in _depends_on(rendered["services"][todo.pop()]).items():
            if dep == target and condition == "service_completed_successfully":
                return True
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return False


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d}", env) == "v d d"
    assert interpolate("${EMPTY-d}|${UNSET-d}", env) == "|d"
    assert interpolate("$$SET $SET ${SET:+alt} ${UNSET:+alt}.", env) == "$SET v alt ."
    with pytest.raises(ValueError, match="UNSET"):
        interpolate("${UNSET:?set it}", env)


@pytest.mark.parametrize("env", [{}, {"AIRFLOW_JWT_SECRET": "x" * 64, "AIRFLOW_FERNET_KEY": "k"}])
def test_every_airflow_container_shares_the_secrets_and_the_execution_api(env: dict[str, str]) -> None:
    rendered = render(env)
    containers = _airflow_containers(rendered)
    assert AIRFLOW_SERVICES | {"airflow-init"} <= set(containers)
    shared = (
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__API_AUTH__JWT_ISSUER",
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW__API__SECRET_KEY",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
        "PYSPARK_PYTHON",
    )
    for key in shared:
        values = {name: service["environment"].get(key) for name, service in containers.items()}
        assert all(values.values()), f"{key} is missing in {[n for n, v in values.items() if not v]}"
        assert len(set(values.values())) == 1, f"{key} differs between Airflow containers: {values}"
    sample = next(iter(containers.values()))["environment"]
    if "AIRFLOW_JWT_SECRET" in env:
        assert sample["AIRFLOW__API_AUTH__JWT_SECRET"] == env["AIRFLOW_JWT_SECRET"]
    else:
        assert len(sample["AIRFLOW__API_AUTH__JWT_SECRET"]) >= 64  # HS512 wants a 512-bit key
        import base64

        assert len(base64.urlsafe_b64decode(sample["AIRFLOW__CORE__FERNET_KEY"])) == 32  # a valid Fernet key
    # Tasks reach the execution API at a service of this file that runs the api-server on that port.
    url = urlparse(sample["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    api_server = rendered["services"][url.hostname]
    assert api_server["command"] == ["airflow", "api-server"] and url.port == 8080
    assert url.path == "/execution/"


def test_one_uid_writes_the_shared_volumes_and_they_are_handed_to_it_first() -> None:
    rendered = render()
    writer_uid = "50000"
    shared_volumes = {"onceflow-state", "airflow-auth"}
    init = rendered["services"]["volumes-init"]
    assert init["user"].split(":")[0] == "0"
    assert init["command"][:3] == ["chown", "-R", f"{writer_uid}:0"]
    init_targets = {v.split(":")[1] for v in init["volumes"]}
    assert set(init["command"][3:]) == init_targets
    for name, service in rendered["services"].items():
        mounted = {v.split(":")[0]: v.split(":")[1] for v in service.get("volumes", [])}
        used = shared_volumes & set(mounted)
        if name == "volumes-init" or not used:
            continue
        assert str(service.get("user", "")).split(":")[0] == writer_uid, (
            f"{name} writes {used} as another uid"
        )
        for volume in used:
            assert f"{volume}:{mounted[volume]}" in init["volumes"], f"{name}: {volume} is not chowned first"
        assert _waits_for(rendered, name, "volumes-init"), f"{name} may start before the volumes are chowned"
    # The images agree: each Dockerfile ends as that uid.
    for dockerfile in ("airflow.Dockerfile", "spark.Dockerfile"):
        users = re.findall(r"^USER (\S+)", (ROOT / "docker" / dockerfile).read_text(), flags=re.MULTILINE)
        assert users[-1] == writer_uid, f"{dockerfile} runs as {users[-1]}"


def _dockerfile_paths(text: str) -> set[str]:
    """Paths a Dockerfile creates: venvs' interpreters, symlinks, made directories, ENV paths."""
    made: set[str] = set()
    for venv in re.findall(r"python3? -m venv (\S+)", text):
        made |= {f"{venv}/bin/python", f"{venv}/bin/pip"}
    made |= set(re.findall(r"ln -s .*?\s(/[\w/.-]+)\s*(?:&&|\\|$)", text, flags=re.MULTILINE))
    return made


def test_interpreters_named_in_the_environment_exist_in_the_image_that_runs_them() -> None:
    rendered = render()
    spark_file = (ROOT / "docker" / "spark.Dockerfile").read_text()
    spark_paths = _dockerfile_paths(spark_file)
    # The Airflow tasks pass PYSPARK_PYTHON on to the executors, which run in the Spark image.
    executor_python = rendered["services"]["airflow-scheduler"]["environment"]["PYSPARK_PYTHON"]
    assert executor_python in spark_paths, f"{executor_python} is not made in spark.Dockerfile"
    assert re.search(rf"^ENV .*PYSPARK_PYTHON={re.escape(executor_python)}\b", spark_file, re.MULTILINE)
    # ... and that interpreter is the one onceflow is installed into.
    [install] = _pip_installs(spark_file)
    assert install.startswith(executor_python.removesuffix("/python") + "/pip install")
    for name in ("spark-master", "spark-worker"):
        program = rendered["services"][name]["command"][0]
        assert program.startswith(tuple(p + "/" for p in spark_paths)), (
            f"{name}: {program} is not in the image"
        )


def test_the_dag_factory_gives_executors_the_python_of_the_environment(monkeypatch) -> None:
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "plugins"))
    from onceflow_airflow.dag_factory import executor_python

    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/onceflow/venv/bin/python")
    assert executor_python() == "/opt/onceflow/venv/bin/python"
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert executor_python() == sys.executable


def _pip_installs(dockerfile_text: str) -> list[str]:
    """The ``pip install`` commands of the Dockerfile's instructions (comments left out)."""
    code = "\n".join(line for line in dockerfile_text.splitlines() if not line.lstrip().startswith("#"))
    joined = code.replace("\\\n", " ")
    return [m.strip() for m in re.findall(r"(\S*pip install [^&\n]+)", joined)]


def _extras(spec: str) -> set[str]:
    found = re.search(r"\[([a-z,]+)\]", spec)
    assert found, spec
    return set(found.group(1).split(","))


def test_images_install_like_the_makefile_venv() -> None:
    makefile = (ROOT / "Makefile").read_text()
    stamp_rule = makefile.split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]
    [venv_install] = [i for i in re.findall(r"pip install (.*)", stamp_rule) if " -e " in f" {i}"]
    assert "-c constraints.txt" in venv_install
    venv_extras = _extras(venv_install)
    for dockerfile in ("airflow.Dockerfile", "spark.Dockerfile"):
        text = (ROOT / "docker" / dockerfile).read_text()
        copied_to = re.search(r"^COPY .*\bconstraints\.txt\b.* (\S+/)$", text, re.MULTILINE)
        assert copied_to, f"{dockerfile} does not copy constraints.txt"
        [install] = _pip_installs(text)
        assert f"-c {copied_to.group(1)}constraints.txt" in install, f"{dockerfile}: {install}"
        assert _extras(install) == venv_extras, f"{dockerfile} installs other extras than `make venv`"


def test_rendered_ports_and_settings_match_the_local_scripts() -> None:
    defaults = _env_sh_defaults()
    text = (ROOT / "docker-compose.yml").read_text()
    for name, default in re.findall(r"\$\{(ONCEFLOW_[A-Z0-9_]+):-([^}]*)\}", text):
        if name in COMPOSE_ONLY:
            continue
        assert defaults.get(name) == default, (
            f"compose defaults {name} to {default!r}, env.sh {defaults.get(name)!r}"
        )
    for name, value in local_env().items():  # the local profile's values are the local scripts'
        assert name not in defaults or defaults[name] == value, f"local.env sets {name} to {value!r}"
    rendered = render()
    kafka_port = defaults["ONCEFLOW_KAFKA_PORT"]
    assert f"127.0.0.1:{kafka_port}:{kafka_port}" in rendered["services"]["kafka"]["ports"]
    assert (
        f"HOST://localhost:{kafka_port}"
        in rendered["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    )
    assert f"127.0.0.1:{defaults['ONCEFLOW_PG_PORT']}:5432" in rendered["services"]["postgres"]["ports"]
    user, password, database = (defaults[f"ONCEFLOW_PG_{k}"] for k in ("USER", "PASSWORD", "DATABASE"))
    env = rendered["services"]["airflow-scheduler"]["environment"]
    assert env["ONCEFLOW_PG_DSN"] == f"postgresql://{user}:{password}@postgres:5432/{database}"
    assert (
        f"max_prepared_transactions={defaults['ONCEFLOW_PG_MAX_PREPARED']}"
        in rendered["services"]["postgres"]["command"]
    )
    # Overridden in the environment, the same variable moves every place that uses it.
    moved = render({"ONCEFLOW_KAFKA_PORT": "29092", "ONCEFLOW_PG_USER": "me"})
    assert "127.0.0.1:29092:29092" in moved["services"]["kafka"]["ports"]
    assert moved["services"]["spark-worker"]["environment"]["ONCEFLOW_PG_DSN"].startswith("postgresql://me:")


def test_the_schema_registry_runs_as_the_local_scripts_run_it() -> None:
    """Apicurio's own image of the version infra/registry.sh resolves, on the same host ports and heap,
    and the onceflow containers pointed at the API path the local URL has."""
    defaults = _env_sh_defaults()
    rendered = render()
    registry = rendered["services"]["registry"]
    assert registry["image"] == f"apicurio/apicurio-registry:{defaults['ONCEFLOW_REGISTRY_VERSION']}"
    env = registry["environment"]
    http, management = env["QUARKUS_HTTP_PORT"], env["QUARKUS_MANAGEMENT_PORT"]
    assert registry["ports"] == [
        f"127.0.0.1:{defaults['ONCEFLOW_REGISTRY_PORT']}:{http}",
        f"127.0.0.1:{defaults['ONCEFLOW_REGISTRY_MANAGEMENT_PORT']}:{management}",
    ]
    assert env["JAVA_OPTS_APPEND"] == f"-Xmx{defaults['ONCEFLOW_REGISTRY_HEAP']}"
    assert f"localhost:{management}/health/ready" in registry["healthcheck"]["test"][-1]
    script = (ROOT / "infra" / "registry.sh").read_text()
    local = re.search(r'^URL="http://\$HOST:\$PORT(/\S+)"$', script, re.MULTILINE)
    assert local, "infra/registry.sh has no URL=http://$HOST:$PORT/... line"
    env_sh = (ROOT / "infra" / "env.sh").read_text()
    default = "http://$ONCEFLOW_REGISTRY_HOST:$ONCEFLOW_REGISTRY_PORT" + local.group(1)
    assert f'ONCEFLOW_SCHEMA_REGISTRY_URL="${{ONCEFLOW_SCHEMA_REGISTRY_URL:-{default}}}"' in env_sh
    urls = {
        name: service["environment"]["ONCEFLOW_SCHEMA_REGISTRY_URL"]
        for name, service in rendered["services"].items()
        if "ONCEFLOW_SCHEMA_REGISTRY_URL" in service.get("environment", {})
    }
    assert set(urls.values()) == {f"http://registry:{http}{local.group(1)}"}
    assert AIRFLOW_SERVICES | {"spark-worker", "spark-connect"} <= set(urls)
    # airflow-init waits for it, and every other Airflow container for airflow-init.
    assert "registry" in _depends_on(rendered["services"]["airflow-init"])


def test_the_spark_connect_server_runs_as_the_local_scripts_run_it(compose) -> None:
    """Same properties file, two single-core workers, the Kafka source of the pinned pyspark, and the
    provider's spark_connect connection pointing the Airflow tasks at it."""
    connect = compose["services"]["spark-connect"]
    command = connect["command"]
    properties = command[command.index("--properties-file") + 1]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in connect["volumes"]}
    assert mounted[properties] == "./infra/spark/connect-server.conf"
    assert "--properties-file" in (ROOT / "infra" / "spark.sh").read_text()
    assert "infra/spark/connect-server.conf" in (ROOT / "infra" / "spark.sh").read_text()
    assert "org.apache.spark.sql.connect.service.SparkConnectServer" in command
    assert command[command.index("--master") + 1] == "spark://spark-master:7077"

    pinned = re.search(r"^pyspark==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    assert pinned
    package = command[command.index("--packages") + 1]
    kafka, avro, delta = package.split(",")
    assert kafka == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pinned.group(1)}"
    # spark-avro of the same minor line, not newer than Spark (not every patch release is published).
    minor = pinned.group(1).rsplit(".", 1)[0]
    assert avro.startswith(f"org.apache.spark:spark-avro_2.13:{minor}.")
    assert int(avro.rsplit(".", 1)[1]) <= int(pinned.group(1).rsplit(".", 1)[1])
    # delta-spark of the version the local scripts resolve (infra/spark/pom.xml).
    spark_pom = (ROOT / "infra" / "spark" / "pom.xml").read_text()
    delta_version = re.search(r"<delta.version>(\S+)</delta.version>", spark_pom)
    assert delta_version
    assert delta == f"io.delta:delta-spark_2.13:{delta_version.group(1)}"

    workers = compose["services"]["spark-worker"]
    assert workers["deploy"]["replicas"] == 2
    assert "--cores" in workers["command"]

    env_sh = (ROOT / "infra" / "env.sh").read_text()
    port = re.search(r"ONCEFLOW_SPARK_CONNECT_PORT:-(\d+)", env_sh)
    assert port and connect["ports"][0].endswith(f":${{ONCEFLOW_SPARK_CONNECT_PORT:-{port.group(1)}}}:15002")
    remote = compose["x-airflow"]["environment"]["ONCEFLOW_SPARK_REMOTE"]
    assert remote.startswith("sc://spark-connect:15002/")


def _local_connect_config() -> dict[str, str]:
    """The worker properties exactly as infra/connect.sh writes them for the local stack."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    out = subprocess.run(
        ["bash", str(ROOT / "infra" / "connect.sh"), "config"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if line and not line.startswith("#"))


# Where the compose worker and the local one may differ: the addresses and the plugin folder.
CONNECT_TOPOLOGY = {"bootstrap.servers", "listeners", "rest.advertised.host.name", "rest.advertised.port"}
CONNECT_TOPOLOGY |= {"plugin.path"}


def test_kafka_connect_runs_as_the_local_scripts_run_it() -> None:
    """Kafka's own image of the broker's version runs one distributed worker with the local worker's
    settings, on the port infra/env.sh gives it, with the plugins the same poms and versions resolve."""
    defaults = _env_sh_defaults()
    rendered = render()
    connect = rendered["services"]["connect"]
    assert connect["image"] == f"apache/kafka:{defaults['ONCEFLOW_KAFKA_VERSION']}"
    program, properties = connect["command"]
    assert program == "/opt/kafka/bin/connect-distributed.sh"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in connect["volumes"]}
    assert mounts["/opt/onceflow/infra/connect"] == "./infra/connect"
    compose_file = ROOT / "infra" / "connect" / properties.removeprefix("/opt/onceflow/infra/connect/")
    lines = compose_file.read_text().splitlines()
    worker = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    local = _local_connect_config()
    shared = {k: v for k, v in local.items() if k not in CONNECT_TOPOLOGY}
    assert {k: v for k, v in worker.items() if k not in CONNECT_TOPOLOGY} == shared
    assert worker["bootstrap.servers"] == "kafka:9092"
    listener_port = worker["listeners"].rsplit(":", 1)[1]
    assert (
        worker["rest.advertised.host.name"] == "connect" and worker["rest.advertised.port"] == listener_port
    )
    assert connect["ports"] == [f"127.0.0.1:{defaults['ONCEFLOW_CONNECT_PORT']}:{listener_port}"]
    assert connect["environment"]["KAFKA_HEAP_OPTS"] == f"-Xmx{defaults['ONCEFLOW_CONNECT_HEAP']}"
    assert local["listeners"] == f"http://127.0.0.1:{defaults['ONCEFLOW_CONNECT_PORT']}"
    # The plugins: a folder per plugin, named as infra/connect.sh names them, under the plugin path.
    assert mounts[worker["plugin.path"]] == "connect-plugins"
    plugins = rendered["services"]["connect-plugins"]
    plugin_mounts = {v.split(":")[0]: v.split(":")[1] for v in plugins["volumes"]}
    assert plugin_mounts["connect-plugins"] == worker["plugin.path"]
    assert plugin_mounts["./infra/connect"] == "/opt/onceflow/infra/connect"
    script = plugins["command"][-1]
    script_text = (ROOT / "infra" / "connect.sh").read_text()
    for name, prop, variable in (
        ("debezium-postgres", "debezium.version", "ONCEFLOW_DEBEZIUM_VERSION"),
        ("apicurio-converter", "apicurio.version", "ONCEFLOW_CONNECT_APICURIO_VERSION"),
    ):
        assert f"{name}:{prop}:{defaults[variable]}" in script
        assert f'plugin {name} {prop} "${variable}"' in script_text
        assert (ROOT / "infra" / "connect" / f"{name}.pom.xml").is_file()
    assert "-DexcludeGroupIds=org.apache.kafka,org.slf4j" in script
    assert "-DexcludeGroupIds=org.apache.kafka,org.slf4j" in script_text
    assert _depends_on(connect) == {
        "kafka": "service_healthy",
        "postgres": "service_healthy",
        "connect-plugins": "service_completed_successfully",
    }
    urls = {
        name: service["environment"]["ONCEFLOW_CONNECT_URL"]
        for name, service in rendered["services"].items()
        if "ONCEFLOW_CONNECT_URL" in service.get("environment", {})
    }
    assert set(urls.values()) == {f"http://connect:{listener_port}"}
    assert set(urls) >= AIRFLOW_SERVICES


def test_postgres_decodes_logically_as_the_local_scripts_start_it() -> None:
    """wal_level=logical with the same number of slots and WAL senders as infra/postgres.sh, and
    replication connections allowed from the other containers."""
    defaults = _env_sh_defaults()
    postgres = render()["services"]["postgres"]
    command = postgres["command"]
    slots = defaults["ONCEFLOW_PG_MAX_REPLICATION_SLOTS"]
    for setting in ("wal_level=logical", f"max_replication_slots={slots}", f"max_wal_senders={slots}"):
        assert setting in command
    script = (ROOT / "infra" / "postgres.sh").read_text()
    assert "-c wal_level=logical -c max_replication_slots=$ONCEFLOW_PG_MAX_REPLICATION_SLOTS" in script
    assert "-c max_wal_senders=$ONCEFLOW_PG_MAX_REPLICATION_SLOTS" in script
    assert 'ALTER ROLE \\"$ONCEFLOW_PG_USER\\" REPLICATION' in script
    init = {v.split(":")[1]: v.split(":")[0] for v in postgres["volumes"]}
    replication = init["/docker-entrypoint-initdb.d/20-replication.sh"]
    assert "host replication all all" in (ROOT / replication).read_text()


def test_the_test_stacks_move_the_connect_port_and_data() -> None:
    """infra/test-stacks.sh gives each stack its own Kafka Connect port and folder, so lanes never share
    a worker (whose internal topics live in the stack's own Kafka)."""
    script = (ROOT / "infra" / "test-stacks.sh").read_text()
    defaults = _env_sh_defaults()
    assert f"ONCEFLOW_CONNECT_PORT={defaults['ONCEFLOW_CONNECT_PORT']}" in script
    derived = script.split("DERIVED=(", 1)[1].split(")", 1)[0].split()
    assert {"ONCEFLOW_CONNECT_DATA", "ONCEFLOW_CONNECT_URL"} <= set(derived)


def test_one_machine_runs_the_lean_runtime_and_the_test_stacks_the_cluster_shape() -> None:
    """`make services` starts the lean Spark runtime by default; the suite's stacks run the cluster shape,
    whose executors its fault tests kill, each with its own S3 gateway port and folder."""
    assert _env_sh_defaults()["ONCEFLOW_SPARK_LEAN"] == "1"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEFLOW_", "AWS_"))}
    script = str(ROOT / "infra" / "test-stacks.sh")
    s3_port = int(_env_sh_defaults()["ONCEFLOW_S3_PORT"])
    for n in (1, 2):
        out = subprocess.run(["bash", script, "settings", str(n)], env=env, capture_output=True, text=True)
        settings = dict(line.split("=", 1) for line in out.stdout.splitlines())
        assert settings["ONCEFLOW_SPARK_LEAN"] == "0", out
        assert int(settings["ONCEFLOW_S3_PORT"]) == s3_port + 1000 * (n - 1)
    text = (ROOT / "infra" / "test-stacks.sh").read_text()
    assert "ONCEFLOW_S3_DATA" in text.split("DERIVED=(", 1)[1].split(")", 1)[0]


# ---------------------------------------------------------------------------------------------------
# docker-compose.cluster.yml, merged over docker-compose.yml as `docker compose -f … -f …` merges them.


class _Override(list):  # type: ignore[type-arg]
    """A sequence tagged ``!override``: it replaces the one it merges over instead of extending it."""


class _ComposeLoader(yaml.SafeLoader):
    pass


_ComposeLoader.add_constructor("!override", lambda loader, node: _Override(loader.construct_sequence(node)))


def _load(name: str) -> dict[str, Any]:
    return yaml.load((ROOT / name).read_text(), Loader=_ComposeLoader)


def _merge(base: Any, over: Any) -> Any:
    if isinstance(over, _Override):
        return list(over)
    if isinstance(base, dict) and isinstance(over, dict):
        return base | {key: _merge(base[key], value) if key in base else value for key, value in over.items()}
    if isinstance(base, list) and isinstance(over, list):
        return base + [item for item in over if item not in base]
    return over


def _cluster_compose() -> dict[str, Any]:
    base, over = _load("docker-compose.yml"), _load("docker-compose.cluster.yml")
    merged = _merge(base, {k: v for k, v in over.items() if k != "services"})
    services = merged["services"]
    for name, service in over["services"].items():
        service = dict(service)
        extends = service.pop("extends", None)
        if extends:
            assert extends["file"] == "docker-compose.yml"
            services[name] = _merge(base["services"][extends["service"]], service)
        else:
            assert name in services, f"docker-compose.cluster.yml: {name} is in neither file"
            services[name] = _merge(services[name], service)
    return merged


def test_the_compose_cluster_runs_the_brokers_the_local_cluster_runs() -> None:
    merged = _cluster_compose()
    services = merged["services"]
    brokers = {
        int(s["environment"]["KAFKA_NODE_ID"]): name
        for name, s in services.items()
        if "KAFKA_NODE_ID" in s.get("environment", {})
    }
    assert sorted(brokers) == [1, 2, 3]
    voters = f"1@{brokers[1]}:9093,2@{brokers[2]}:9093,3@{brokers[3]}:9093"
    for node, name in brokers.items():
        env = services[name]["environment"]
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == voters
        assert env["CLUSTER_ID"] == services["kafka"]["environment"]["CLUSTER_ID"]
        local = _local_broker_config(brokers=3, node=node)
        assert _shared(_broker_settings(env)) == _shared(local), name
        # Clients on the host reach broker n where they reach it locally.
        host_port = re.search(r":(\d+)$", local["advertised.listeners"]).group(1)
        assert interpolate(env["KAFKA_ADVERTISED_LISTENERS"], {}).endswith(f"HOST://localhost:{host_port}")
        assert interpolate(services[name]["ports"][0], {}) == f"127.0.0.1:{host_port}:{host_port}"
        assert env["KAFKA_ADVERTISED_LISTENERS"].startswith(f"PLAINTEXT://{name}:9092,")
    volumes = [services[name]["volumes"][0].split(":")[0] for name in brokers.values()]
    assert len(set(volumes)) == 3 and set(volumes) <= set(merged["volumes"])
    for name, service in services.items():
        bootstrap = service.get("environment", {}).get("ONCEFLOW_KAFKA_BOOTSTRAP")
        if bootstrap is not None:
            assert sorted(bootstrap.split(",")) == sorted(f"{b}:9092" for b in brokers.values()), name


def _published(services: dict[str, Any], env: dict[str, str]) -> dict[str, list[str]]:
    return {
        name: [interpolate(str(port), env) for port in service.get("ports", [])]
        for name, service in services.items()
        if service.get("ports")
    }


@pytest.mark.parametrize("merged", [False, True], ids=["single-broker", "cluster"])
def test_every_published_port_is_on_loopback_unless_the_user_says_otherwise(merged: bool) -> None:
    """Kafka without authentication, PostgreSQL's superuser, Spark Connect and Airflow: nothing is
    reachable from other machines by default; ONCEFLOW_BIND chooses the interface."""
    services = (_cluster_compose() if merged else _load("docker-compose.yml"))["services"]
    published = _published(services, local_env())
    expected = {"kafka", "postgres", "registry", "spark-connect", "connect", "airflow-api-server", "s3"}
    assert expected <= set(published)
    for name, ports in published.items():
        for port in ports:
            assert port.startswith("127.0.0.1:") and port.count(":") == 2, f"{name} publishes {port}"
    for name, ports in _published(services, {**local_env(), "ONCEFLOW_BIND": "0.0.0.0"}).items():
        assert all(port.startswith("0.0.0.0:") for port in ports), name


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_secrets_are_required_outside_the_local_profile(secret: str) -> None:
    """Without the local profile's env file, compose refuses to start without each secret, naming it."""
    assert set(local_env()) == SECRETS
    text = (ROOT / "docker-compose.yml").read_text()
    assert re.findall(rf"\$\{{{secret}:-", text) == [], f"{secret} has a default in docker-compose.yml"
    partial = {k: v for k, v in local_env().items() if k != secret}
    with pytest.raises(ValueError, match=rf"required variable {secret} is missing: set {secret}"):
        render(partial, local=False)
    rendered = render({secret: "s3cret-of-mine"})
    found = json.dumps(rendered)
    assert "s3cret-of-mine" in found


def test_the_admin_password_is_the_one_the_user_sets() -> None:
    init = render({"AIRFLOW_ADMIN_PASSWORD": "pw"})["services"]["airflow-init"]
    assert init["environment"]["AIRFLOW_ADMIN_PASSWORD"] == "pw"
    assert "AIRFLOW__API_AUTH__JWT_SECRET" in init["environment"]  # and the shared settings stay
    script = init["command"][-1]
    assert 'os.environ["AIRFLOW_ADMIN_PASSWORD"]' in script and '"admin": "admin"' not in script


@pytest.mark.parametrize("merged", [False, True], ids=["single-broker", "cluster"])
def test_the_spark_connect_server_answers_only_clients_with_its_token(merged: bool) -> None:
    """The Connect server runs code with the containers' credentials: it starts only with a token (compose
    refuses without one), and every Airflow container presents that same token in a way the pyspark
    client sends without TLS to a host that is not localhost (the gRPC authorization header)."""
    from pyspark.sql.connect.client import DefaultChannelBuilder

    token = "ab12" * 16
    raw = _cluster_compose() if merged else _load("docker-compose.yml")
    services = raw["services"]

    def env_of(name: str, values: dict[str, str]) -> dict[str, str]:
        return {k: interpolate(str(v), values) for k, v in (services[name].get("environment") or {}).items()}

    given = {**local_env(), "SPARK_CONNECT_AUTHENTICATE_TOKEN": token}
    assert env_of("spark-connect", given).get("SPARK_CONNECT_AUTHENTICATE_TOKEN") == token
    without = {k: v for k, v in local_env().items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"}
    with pytest.raises(ValueError, match="SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        env_of("spark-connect", without)
    clients = [n for n, s in services.items() if str(s.get("image", "")).startswith("onceflow/airflow")]
    assert set(clients) >= AIRFLOW_SERVICES
    for name in clients:
        env = env_of(name, given)
        assert "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT" not in env, name  # pyspark: a token= needs TLS
        builder = DefaultChannelBuilder(env["ONCEFLOW_SPARK_REMOTE"])
        assert builder.host == "spark-connect" and not builder.secure, name
        assert ("authorization", f"Bearer {token}") in list(builder.metadata()), name


def test_the_compose_postgres_never_trusts_a_connection() -> None:
    """The local stack's PostgreSQL trusts loopback (README says why); the compose one is reachable from
    every container and perhaps other machines: it asks every connection, its own socket's included, for
    a scram-sha-256 password, and no pg_hba line it writes trusts."""
    env = render()["services"]["postgres"]["environment"]
    assert "--auth=scram-sha-256" in env.get("POSTGRES_INITDB_ARGS", "").split()  # else initdb trusts local
    assert env.get("POSTGRES_HOST_AUTH_METHOD") == "scram-sha-256"
    assert env.get("POSTGRES_PASSWORD")
    for name in ("docker-compose.yml", "docker-compose.cluster.yml", "docker/postgres-replication.sh"):
        assert not re.search(r"\btrust\b", (ROOT / name).read_text()), f"{name} mentions trust"


def test_the_object_store_runs_as_the_local_scripts_run_it() -> None:
    """The s3 service is infra/s3.sh's gateway: the same version, region, bucket and published port by
    default, started with the keys every onceflow container is given, and a volume of its own."""
    defaults = _env_sh_defaults()
    script = (ROOT / "infra" / "s3.sh").read_text()
    assert "versitygw" in script and "posix" in script
    rendered = render()
    s3 = rendered["services"]["s3"]
    assert s3["image"] == f"versity/versitygw:{defaults['ONCEFLOW_S3_VERSION']}"
    assert s3["command"][-2:] == ["posix", "/data"]
    assert s3["command"][s3["command"].index("--region") + 1] == defaults["ONCEFLOW_S3_REGION"]
    assert s3["ports"] == [f"127.0.0.1:{defaults['ONCEFLOW_S3_PORT']}:7070"]
    bucket = rendered["services"]["s3-bucket"]
    assert bucket["command"][-1] == f"/data/{defaults['ONCEFLOW_S3_BUCKET']}"
    assert {v.split(":")[0] for v in s3["volumes"]} == {v.split(":")[0] for v in bucket["volumes"]}
    env = rendered["x-onceflow-env"]
    assert env["AWS_ENDPOINT_URL"] == "http://s3:7070"
    assert env["AWS_REGION"] == defaults["ONCEFLOW_S3_REGION"]
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
        s3["environment"]["ROOT_ACCESS_KEY"],
        s3["environment"]["ROOT_SECRET_KEY"],
    )
    for container in _airflow_containers(rendered).values():
        assert container["environment"]["AWS_ENDPOINT_URL"] == "http://s3:7070"
