"""A slice that fails keeps its cause: the transform's exception, with the pipeline's own frame, is the
epoch's abort reason and the runner's error, not Spark's shutdown lines (spark-submit path)."""

from __future__ import annotations

import subprocess
import textwrap
import time
import uuid

import pytest

from onceflow.config import Settings
from onceflow.engine.runner import ProcessFailed, run_epoch
from onceflow.ledger import EpochStatus, Ledger
from tests.integration.engine.data import orders, prepared_count, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODULE = """
import time
from dataclasses import replace

from pyspark.sql import functions as F

from tests.integration.engine.pipelines import orders_pipeline


def on_the_driver(frame):
    raise ValueError("boom: the driver refused the frame")


def refuse(amount):
    raise ValueError("boom: amount refused on an executor")


def on_an_executor(frame):
    return frame.select("id", F.udf(refuse, "double")(frame.amount).alias("amount"), "customer")


def stall(frame):
    time.sleep(600)  # a driver that hangs: the runner must not wait for it, nor keep its lease
    return frame


DRIVER = replace(orders_pipeline(), transform="{name}:on_the_driver")
HUNG = replace(orders_pipeline(), transform="{name}:stall", transaction_timeout_s=15)
EXECUTOR = replace(orders_pipeline(), transform="{name}:on_an_executor")
"""


@pytest.mark.parametrize(
    ("spec", "message", "function"),
    [
        ("DRIVER", "ValueError: boom: the driver refused the frame", "on_the_driver"),
        ("EXECUTOR", "ValueError: boom: amount refused on an executor", "refuse"),
    ],
)
def test_the_transforms_exception_is_the_abort_reason_and_the_runners_error(
    stack, settings, tmp_path, monkeypatch, pg_connect, spec: str, message: str, function: str
) -> None:
    name = f"failing_{uuid.uuid4().hex[:8]}"
    module = tmp_path / f"{name}.py"
    module.write_text(textwrap.dedent(MODULE).replace("{name}", name))
    monkeypatch.syspath_prepend(str(tmp_path))  # the spark-submit child gets this process's path
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 6))
    with pytest.raises(ProcessFailed) as failed:
        run_epoch(f"{name}:{spec}", Settings.from_env(), executor="submit")
    frame = f"(at {module}:"
    assert message in str(failed.value) and frame in str(failed.value), failed.value
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        (epoch,) = ledger.epochs(stack["ONCEFLOW_TEST_PIPELINE"])
    assert epoch.status is EpochStatus.ABORTED
    reason = epoch.abort_reason or ""
    assert reason.startswith("process failed: slice 0: ") and message in reason, reason
    assert frame in reason and reason.endswith(f" in {function})"), reason
    assert "SparkContext" not in reason and "Traceback" not in reason
    assert prepared_count(pg_connect, stack["ONCEFLOW_TEST_PIPELINE"]) == 0


def test_a_hung_spark_submit_is_killed_at_the_transaction_timeout_and_its_epoch_aborted(
    stack, settings, tmp_path, monkeypatch, pg_connect
) -> None:
    name = f"hanging_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE).replace("{name}", name))
    monkeypatch.syspath_prepend(str(tmp_path))
    produce(settings.kafka_bootstrap, stack["ONCEFLOW_TEST_TOPIC"], orders(0, 6))
    started = time.monotonic()
    with pytest.raises(ProcessFailed, match=r"ran past the pipeline's transaction timeout \(15 s\)"):
        run_epoch(f"{name}:HUNG", Settings.from_env(), executor="submit")
    assert time.monotonic() - started < 90  # not the transform's ten minutes
    left = subprocess.run(["pgrep", "-f", f"{name}:HUNG"], capture_output=True, text=True, check=False)
    assert left.stdout == ""  # spark-submit, its JVM and the Python driver were killed together
    with Ledger.connect(stack["ONCEFLOW_LEDGER_URL"]) as ledger:
        (epoch,) = ledger.epochs(stack["ONCEFLOW_TEST_PIPELINE"])
    assert epoch.status is EpochStatus.ABORTED and "transaction timeout" in (epoch.abort_reason or "")
    assert prepared_count(pg_connect, stack["ONCEFLOW_TEST_PIPELINE"]) == 0
