"""The lean runtime (``ONCEFLOW_SPARK_LEAN=1``): one JVM, the Spark Connect server running the tasks itself.

Started here on ports of its own, with short idle times for its Python daemons and its sessions, beside
the suite's runtime of a master, two workers and their executors.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest
from local_stack.footprint import daemons, python_workers
from local_stack.ports import free_ports
from local_stack.spark_runtime import SCRIPT, SparkRuntime

from onceflow.config import Settings
from onceflow.engine.connect import forget_session
from onceflow.engine.runner import run_epoch
from onceflow.ledger import EpochStatus
from tests.integration.engine.data import ORDERS, delivered_ids, orders, prepared_count, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

IDLE_S = 5
# The server closes a session idle for 20 s (checked every 2 s); the suite's runtime, after 10 minutes.
# At 10 s, on a loaded machine, the session closed in the middle of the second epoch's slice.
SESSION_IDLE_S = 20
SESSION_CHECK_S = 2
SESSION_TIMEOUT = " ".join(
    (
        f"spark.connect.session.manager.defaultSessionTimeout={SESSION_IDLE_S}s",
        f"spark.connect.session.manager.maintenanceInterval={SESSION_CHECK_S}s",
    )
)


@pytest.fixture(scope="module")
def lean(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SparkRuntime, str]]:
    """A lean runtime whose Python daemons exit after IDLE_S idle seconds: the runtime and its remote."""
    home = tmp_path_factory.mktemp("lean")
    connect, ui = free_ports(2)
    env = {
        **os.environ,
        "ONCEFLOW_SPARK_DATA": str(home / "spark"),
        "ONCEFLOW_SPARK_CONNECT_PORT": str(connect),
        "ONCEFLOW_SPARK_UI_PORT": str(ui),
        "ONCEFLOW_SPARK_LEAN": "1",
        "ONCEFLOW_PYTHON_DAEMON_IDLE_S": str(IDLE_S),
        "ONCEFLOW_SPARK_CONF": SESSION_TIMEOUT,
    }
    runtime = SparkRuntime.from_env(env)
    try:
        remote = runtime.start()
        yield runtime, remote
        forget_session(remote, release=False)
    finally:
        runtime.stop(kill=True)


def _daemons(runtime: SparkRuntime) -> list[int]:
    return [p.pid for p in daemons(runtime, python_workers(runtime))]


def _environ(pid: int) -> dict[str, str]:
    """A process's environment; empty once it has exited."""
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return {}


def test_a_lean_runtime_is_one_jvm_delivers_once_and_its_idle_python_daemons_exit(
    stack, settings, pg_connect, lean, capfd
) -> None:
    """SPARK-54055 (a Python daemon per session, kept until the executor stops) holds in local mode too:
    the runtime's daemon exits once idle. Meanwhile the server closes the idle session; the next epoch,
    in the same process, finds it gone, joins the pipeline's next session id, gets a new daemon and
    commits exactly once. A start of the other shape over it is refused in one line, and it keeps
    running."""
    runtime, remote = lean
    server = runtime.pid("connect")
    assert runtime.lean and server is not None and runtime.pids() == [server]
    assert runtime.pid("master") is None and runtime.pid("worker-1") is None

    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 30))
    one = run_epoch(ORDERS, Settings.from_env(), executor="connect", spark_remote_url=remote)
    assert one.epoch.status == EpochStatus.COMMITTED
    first = _daemons(runtime)
    assert first, "the epoch ran no Python daemon under the Connect server"
    assert str(IDLE_S) in {_environ(pid).get("ONCEFLOW_PYTHON_DAEMON_IDLE_S") for pid in first}
    # The workers exit with their task; the daemon then waits its own idle time.
    ended = time.monotonic()
    deadline = ended + IDLE_S + 60
    while _daemons(runtime):
        assert time.monotonic() < deadline, "the lean runtime's Python daemons did not exit when idle"
        time.sleep(3)
    # The server closes the session once idle for SESSION_IDLE_S (checked every SESSION_CHECK_S): wait
    # that out too.
    time.sleep(max(0.0, ended + SESSION_IDLE_S + SESSION_CHECK_S + 3 - time.monotonic()))

    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(30, 30))
    two = run_epoch(ORDERS, Settings.from_env(), executor="connect", spark_remote_url=remote)
    assert two.epoch.number == 2 and two.epoch.status == EpochStatus.COMMITTED
    said = capfd.readouterr().err
    joined = re.findall(r"joined the Spark Connect session (\S+)", said)
    assert len(joined) == 2 and joined[0] != joined[1], joined
    assert "is gone" in said and "SESSION_CLOSED" in said, said[-3000:]
    assert _daemons(runtime), "no daemon started again"
    expected = sorted(o["id"] for o in orders(0, 60) if o["amount"] > 0)
    assert delivered_ids(pg_connect, stack) == (expected, expected)
    assert prepared_count(pg_connect, stack["ONCEFLOW_TEST_PIPELINE"]) == 0

    env = {**runtime.env, "ONCEFLOW_SPARK_LEAN": "0"}
    refused = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("[onceflow] error:")]
    assert refused.returncode != 0 and len(errors) == 1, refused.stderr
    assert "stop it first" in errors[0] and "local[" in errors[0], errors
    assert runtime.pid("master") is None and psutil.pid_exists(server)
