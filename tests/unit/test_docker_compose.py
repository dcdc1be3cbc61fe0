"""docker-compose.yml cannot be run here (no Docker engine), so check it statically against the repo."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_SERVICES = {"airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env_sh_variables() -> set[str]:
    text = (ROOT / "infra" / "env.sh").read_text()
    return set(re.findall(r"^export (ONCEFLOW_[A-Z_]+)=", text, flags=re.MULTILINE))


def test_topology_has_every_service(compose) -> None:
    services = set(compose["services"])
    assert {"kafka", "postgres", "spark-master", "spark-worker"} | AIRFLOW_SERVICES <= services


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
    used = set(re.findall(r"\b(ONCEFLOW_[A-Z_]+)\b", text))
    assert used <= local, f"compose uses variables the local scripts do not define: {used - local}"
    onceflow_env = compose["x-onceflow-env"]
    assert {"ONCEFLOW_KAFKA_BOOTSTRAP", "ONCEFLOW_PG_DSN", "ONCEFLOW_LEDGER_URL"} <= set(onceflow_env)


def test_kafka_and_postgres_settings_match_what_exactly_once_needs(compose) -> None:
    kafka = compose["services"]["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert int(kafka["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"]) == 1
    assert int(kafka["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == 1
    local_kafka = (ROOT / "infra" / "kafka.sh").read_text()
    assert "transaction.state.log.min.isr=1" in local_kafka
    assert f"transaction.max.timeout.ms={kafka['KAFKA_TRANSACTION_MAX_TIMEOUT_MS']}" in local_kafka

    command = " ".join(compose["services"]["postgres"]["command"])
    match = re.search(r"max_prepared_transactions=\$\{ONCEFLOW_PG_MAX_PREPARED:-(\d+)\}", command)
    assert match and int(match.group(1)) >= 64
    assert f"ONCEFLOW_PG_MAX_PREPARED:-{match.group(1)}" in (ROOT / "infra" / "env.sh").read_text()


def test_default_ports_match_the_local_scripts(compose) -> None:
    env_sh = (ROOT / "infra" / "env.sh").read_text()
    kafka_port = re.search(r"ONCEFLOW_KAFKA_PORT:-(\d+)", env_sh).group(1)
    pg_port = re.search(r"ONCEFLOW_PG_PORT:-(\d+)", env_sh).group(1)
    assert f"${{ONCEFLOW_KAFKA_PORT:-{kafka_port}}}" in compose["services"]["kafka"]["ports"][0]
    assert compose["services"]["postgres"]["ports"][0].startswith(f"${{ONCEFLOW_PG_PORT:-{pg_port}}}")
