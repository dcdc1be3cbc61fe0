"""infra/spark.sh puts the local Spark Connect server behind a token that the printed remote carries."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def remote(home: Path, **extra: str) -> str:
    """``ONCEFLOW_SPARK_REMOTE`` as ``infra/spark.sh env`` prints it for eval."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    env.update({"ONCEFLOW_HOME": str(home), "ONCEFLOW_SPARK_PYTHON": sys.executable, **extra})
    out = subprocess.run(
        ["bash", str(ROOT / "infra" / "spark.sh"), "env"], env=env, capture_output=True, text=True, check=True
    ).stdout
    name, _, value = out.strip().partition("=")
    assert name == "ONCEFLOW_SPARK_REMOTE"
    return shlex.split(value)[0]


def test_the_remote_carries_the_servers_token_to_localhost(tmp_path: Path) -> None:
    token_file = tmp_path / "spark" / "connect.token"
    token_file.parent.mkdir()
    token_file.write_text("f00d" * 16 + "\n")
    # The pyspark client sends a token without TLS to "localhost" only: the remote must name it so.
    assert remote(tmp_path) == f"sc://localhost:15002/;token={'f00d' * 16}"


def test_a_connect_server_off_loopback_is_refused_not_started_without_its_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    env.update({"ONCEFLOW_HOME": str(tmp_path), "ONCEFLOW_SPARK_PYTHON": sys.executable})
    for command in ("env", "start"):
        done = subprocess.run(
            ["bash", str(ROOT / "infra" / "spark.sh"), command],
            env={**env, "ONCEFLOW_SPARK_HOST": "10.1.2.3"},
            capture_output=True,
            text=True,
        )
        assert done.returncode != 0 and not done.stdout, done.stdout
        (line,) = done.stderr.strip().splitlines()  # one line, before anything starts
        assert "ONCEFLOW_SPARK_HOST=10.1.2.3 is not loopback" in line
    assert not (tmp_path / "spark" / "connect.token").exists()


def test_the_token_is_made_private_and_given_to_the_server_in_its_environment() -> None:
    script = (ROOT / "infra" / "spark.sh").read_text()
    assert "umask 077" in script and "secrets.token_hex(32)" in script
    assert "export SPARK_CONNECT_AUTHENTICATE_TOKEN" in script
    assert "spark.connect.authenticate.token" not in script  # never on the server's command line
    said = [line for line in script.splitlines() if "onceflow_say" in line]
    assert said and not any("remote)" in line or "TOKEN" in line for line in said)
