"""README's "Write your own pipeline", followed literally against the local stack.

Each code block of the section is marked by the HTML comment before it: ``file PATH`` blocks are written
into a scratch folder, ``run`` blocks run there in bash one after the other (each starts from the
environment the previous one left, as in one shell session), an ``output`` block must be what the
``run`` block before it printed, and ``parse`` blocks (the Airflow commands) are checked by bash only.
The ``settings`` block is the one thing replaced: by the local stack's settings, with a fresh database
and ledger, so that the outcome the README shows is exactly the one to expect.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from onceflow.config import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Write your own pipeline"
# Run after SECTION, in its folder and its shell's environment (it reads the clicks that one produced).
BUCKET_SECTION = "## Write to a bucket"
BUCKET_PREFIX = "lake"
_BLOCK = re.compile(r"<!-- readme-test: (\w+)(?: (\S+))? -->\n```(\w+)\n(.*?)```\n", re.DOTALL)


@dataclass(frozen=True)
class Block:
    kind: str
    arg: str | None
    language: str
    body: str


def section_blocks(heading: str = SECTION) -> list[Block]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    blocks = [Block(m[1], m[2], m[3], m[4]) for m in _BLOCK.finditer(section)]
    for match in _BLOCK.finditer(section):
        if match.group(1) == "file":  # the mark is invisible: the prose before must name the file
            before = section[: match.start()].rsplit("```", 1)[-1]
            assert f"`{match.group(2)}`" in before, f"{heading}: no visible name for {match.group(2)}"
    fences = section.count("\n```") // 2
    assert len(blocks) == fences, f"{heading}: {fences - len(blocks)} code blocks without a readme-test mark"
    return blocks


def _env_after(
    script: str, env: dict[str, str], cwd: Path
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run ``script`` in bash like a shell session would, and the environment it leaves behind."""
    dump = cwd / f".env-{uuid.uuid4().hex}"
    result = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{script}\nenv -0 > {dump}"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"README commands failed:\n{script}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    pairs = (item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)
    new_env = {k: v for k, v in pairs}
    dump.unlink()
    return result, new_env


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def _topics_created(blocks: list[Block]) -> list[str]:
    return [
        name
        for b in blocks
        if b.kind == "run"
        for name in re.findall(r"onceflow topics create (\S+)", b.body)
    ]


def _delete_topics(admin: Any, names: list[str]) -> None:
    """Delete the README's topics and wait until the broker no longer lists them."""
    present = [n for n in names if n in admin.list_topics(timeout=10).topics]
    if present:
        for future in admin.delete_topics(present).values():
            future.result(timeout=30)
    deadline = time.monotonic() + 30
    while any(n in admin.list_topics(timeout=10).topics for n in names):
        assert time.monotonic() < deadline, f"topics {names} still listed 30 s after deletion"
        time.sleep(0.3)


@pytest.fixture
def readme_topics(kafka_admin: Any) -> Any:
    names = _topics_created(section_blocks())
    assert names, f"{SECTION} creates no topic"
    _delete_topics(kafka_admin, names)  # a previous run's records would be read again by a fresh ledger
    yield names
    _delete_topics(kafka_admin, names)


def test_the_section_runs_as_written(
    tmp_path: Path, settings: Settings, pg_database: str, readme_topics: list[str]
) -> None:
    blocks = section_blocks()
    assert blocks[0].kind == "settings" and 'eval "$(make -s services)"' in blocks[0].body
    # The settings the first block loads: the local stack's, with a database and a ledger of this test.
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("ONCEFLOW_PIPELINES", "PYTHONPATH")},
        "ONCEFLOW_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "ONCEFLOW_PG_DSN": pg_database,
        "ONCEFLOW_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
        "ONCEFLOW_HOME": str(tmp_path / ".onceflow"),
        "ONCEFLOW_CHECKOUT": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    folder = tmp_path / "work"
    folder.mkdir()
    env = _run_blocks(blocks[1:], env, folder)

    # The promise behind the output shown: each click once, even after the second run.
    import psycopg

    with psycopg.connect(pg_database) as conn:
        rows = conn.execute("SELECT count(*), count(DISTINCT (_partition, _offset)) FROM clicks").fetchone()
    assert rows == (3, 3)
    _check_spark_and_airflow_route(blocks, env, folder, settings)

    # The bucket section, on the stack's S3 server, from an empty prefix (a ledger of this test).
    assert settings.s3 is not None, "the local stack's S3 server is not in the settings"
    _empty_prefix(settings, BUCKET_PREFIX)
    try:
        _run_blocks(section_blocks(BUCKET_SECTION), env, folder)
    finally:
        _empty_prefix(settings, BUCKET_PREFIX)


def _empty_prefix(settings: Settings, prefix: str) -> None:
    from onceflow.storage.store import Store

    url = f"s3://onceflow/{prefix}"
    Store.for_location(url, settings.s3).delete_dir(url)


def _run_blocks(blocks: list[Block], env: dict[str, str], folder: Path) -> dict[str, str]:
    """Follow ``blocks`` in ``folder``; the environment the last ``run`` block left."""
    last: subprocess.CompletedProcess[str] | None = None
    for block in blocks:
        if block.kind == "file":
            assert block.arg is not None
            path = folder / block.arg
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
        elif block.kind == "run":
            last, env = _env_after(block.body, env, folder)
        elif block.kind == "output":
            assert last is not None, "an output block before any command"
            assert _lines(last.stdout) == _lines(block.body), (
                f"README shows:\n{block.body}\ngot:\n{last.stdout}"
            )
        elif block.kind == "parse":
            checked = subprocess.run(["bash", "-n"], input=block.body, text=True, capture_output=True)
            assert checked.returncode == 0, checked.stderr
        else:
            pytest.fail(f"unknown readme-test mark {block.kind!r}")
    return env


def _check_spark_and_airflow_route(
    blocks: list[Block], env: dict[str, str], folder: Path, settings: Settings
) -> None:
    """What the README does not run here: the transform resolves, the spec takes it, the DAG file builds
    the pipeline's DAG, and the Airflow block sets what the local stack's Airflow environment sets."""
    from local_stack.local_airflow import airflow_environment

    from onceflow.engine.submit import spark_environment

    base = spark_environment(settings, {})
    needed = set(airflow_environment(settings, ROOT, folder / "airflow", {})) - set(base) - {"PYTHONPATH"}
    airflow_block = next(b.body for b in blocks if b.kind == "parse")
    missing = sorted(k for k in needed if f"{k}=" not in airflow_block)
    assert not missing, f"the README's Airflow commands do not set {missing}"

    dag_file = next(b.arg for b in blocks if b.kind == "file" and b.arg and b.arg.startswith("dags/"))
    check = (
        "import dataclasses, runpy\n"
        "from onceflow.pipeline import import_dotted, load_pipeline\n"
        "spec = load_pipeline('my_pipelines.clicks:CLICKS')\n"
        "import_dotted('my_pipelines.pages:lowercase_pages')\n"
        "dataclasses.replace(spec, transform='my_pipelines.pages:lowercase_pages').load_transform()\n"
        f"dag = runpy.run_path({dag_file!r})['dag']\n"
        "print(dag.dag_id, sorted(dag.task_ids))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", check],
        env={**env, "PYTHONPATH": f"{folder}:{ROOT / 'plugins'}"},
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "onceflow_clicks"
    assert "'process_s0'" in result.stdout and "'commit'" in result.stdout


def test_topics_create_is_idempotent_and_keeps_partition_counts(kafka_admin: Any, settings: Settings) -> None:
    onceflow = str(Path(sys.executable).with_name("onceflow"))
    name = f"readme-topic-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "ONCEFLOW_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}

    def create(partitions: int) -> subprocess.CompletedProcess[str]:
        command = [onceflow, "topics", "create", name, "--partitions", str(partitions)]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    try:
        first, again, other = create(3), create(3), create(2)
        assert (first.returncode, first.stdout.strip()) == (
            0,
            f"created topic {name!r} with 3 partitions on {settings.kafka_bootstrap}",
        ), first.stderr
        assert len(kafka_admin.list_topics(name, timeout=10).topics[name].partitions) == 3
        assert (again.returncode, again.stdout.strip()) == (
            0,
            f"topic {name!r} already exists with 3 partitions: nothing to do",
        ), again.stderr
        assert other.returncode == 1
        assert other.stderr.strip() == (
            f"onceflow: error: topic {name!r} already exists with 3 partitions, not 2; onceflow does not "
            "change a topic's partitions: use another name, or keep its partition count"
        )
        assert len(kafka_admin.list_topics(name, timeout=10).topics[name].partitions) == 3
    finally:
        _delete_topics(kafka_admin, [name])
