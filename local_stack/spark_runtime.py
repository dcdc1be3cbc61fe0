"""The local warm Spark runtime of `infra/spark.sh`, seen from Python: its processes and its REST API.

The demo kills its Connect server mid-epoch, the bench samples its memory, the cluster-fault tests kill
its workers while tasks run: all of them find the processes by the script's pid files and the running
tasks through Spark's monitoring REST API. The folder and ports are the ones the script itself resolves
(`infra/env.sh`, given the same environment), so the two can never disagree.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "infra" / "spark.sh"
ENV_SH = ROOT / "infra" / "env.sh"
WORKERS = ("worker-1", "worker-2")


def _resolved(names: tuple[str, ...], env: Mapping[str, str]) -> dict[str, str]:
    """Settings as infra/env.sh resolves them in ``env`` (each variable, else its default)."""
    script = f'. "{ENV_SH}" && ' + " && ".join(f'printf "%s\\0" "${name}"' for name in names)
    shown = subprocess.run(["bash", "-c", script], env=dict(env), capture_output=True, text=True, check=True)
    return dict(zip(names, shown.stdout.split("\0"), strict=False))


@dataclass(frozen=True)
class SparkRuntime:
    """One runtime: where its pid files are and where its application's REST API answers."""

    data: Path
    ui_port: int
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SparkRuntime:
        environ = dict(os.environ if env is None else env)
        found = _resolved(("ONCEFLOW_SPARK_DATA", "ONCEFLOW_SPARK_UI_PORT"), environ)
        return cls(Path(found["ONCEFLOW_SPARK_DATA"]), int(found["ONCEFLOW_SPARK_UI_PORT"]), environ)

    def start(self) -> str:
        """Start what is not running (infra/spark.sh start) and return its ``sc://`` remote."""
        env = {**self.env, "ONCEFLOW_SPARK_DATA": str(self.data), "ONCEFLOW_SPARK_UI_PORT": str(self.ui_port)}
        started = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True)
        if started.returncode != 0:
            said = [line for line in started.stderr.splitlines() if line.startswith("[onceflow]")]
            raise RuntimeError("infra/spark.sh start failed: " + "\n".join([*said, started.stderr[-2000:]]))
        # The line is shell-quoted for eval (a token's ';' is escaped).
        return shlex.split(started.stdout.strip().splitlines()[-1].split("=", 1)[1])[0]

    def stop(self, *, kill: bool = False) -> None:
        env = {**self.env, "ONCEFLOW_SPARK_DATA": str(self.data), "ONCEFLOW_SPARK_UI_PORT": str(self.ui_port)}
        subprocess.run([str(SCRIPT), "stop", *(["--kill"] if kill else [])], env=env, capture_output=True)

    def pid(self, name: str) -> int | None:
        """The pid in ``{name}.pid`` (master, worker-1, worker-2, connect), or None without one."""
        try:
            return int((self.data / f"{name}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    @property
    def lean(self) -> bool:
        """Whether the Connect server runs the tasks itself (``ONCEFLOW_SPARK_LEAN=1``, local mode), as
        infra/spark.sh recorded when it started it."""
        try:
            return (self.data / "connect.master").read_text().startswith("local")
        except OSError:
            return False

    def executor_pids(self) -> list[int]:
        """The executors the workers started (their Python workers are the executors' children); on a
        lean runtime, the Connect server, which is its own executor."""
        import psutil

        if self.lean:
            server = self.pid("connect")
            return [] if server is None else [server]
        found: list[int] = []
        for worker in WORKERS:
            try:
                found += [child.pid for child in psutil.Process(self.pid(worker) or -1).children()]
            except (psutil.Error, ValueError):
                continue
        return found

    def pids(self) -> list[int]:
        """Every process of the runtime: master, workers, Connect server, executors (each once)."""
        named = [self.pid(name) for name in ("master", *WORKERS, "connect")]
        return list(dict.fromkeys([p for p in named if p is not None] + self.executor_pids()))

    def rest(self, path: str, timeout: float = 5) -> Any:
        """``/api/v1/applications/<the Connect server's application>/<path>``, decoded."""
        api = f"http://127.0.0.1:{self.ui_port}/api/v1/applications"
        with urllib.request.urlopen(api, timeout=timeout) as answer:
            app = json.load(answer)[0]["id"]
        with urllib.request.urlopen(f"{api}/{app}/{path}", timeout=timeout) as answer:
            return json.load(answer)

    def running_jobs(self) -> int:
        """Jobs running now; 0 when the server does not answer."""
        try:
            return len(self.rest("jobs?status=running", timeout=2))
        except (OSError, ValueError, LookupError):
            return 0

    def active_tasks(self, executor_id: str | None = None) -> int:
        """Tasks running now on the executors (or one of them); 0 when the server does not answer."""
        try:
            executors = self.rest("executors")
        except (OSError, ValueError, LookupError):
            return 0
        return sum(
            e["activeTasks"] for e in executors if e["id"] != "driver" and executor_id in (None, e["id"])
        )

    def failed_tasks(self) -> int:
        return sum(stage["numFailedTasks"] for stage in self.rest("stages"))

    def task_attempts(self) -> list[dict[str, Any]]:
        """Every task attempt of every stage, each with its ``stageId``."""
        stages = self.rest("stages?details=true", timeout=10)
        return [
            {**task, "stageId": stage["stageId"]}
            for stage in stages
            for task in (stage.get("tasks") or {}).values()
        ]
