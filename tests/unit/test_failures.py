"""A failed slice's cause on one line: the exception the pipeline's code raised, and where."""

from __future__ import annotations

from onceflow.engine.failures import cause_in_output, failure_line
from onceflow.errors import ConfigError


def test_an_error_from_a_python_worker_is_its_own_last_line_with_the_pipelines_frame() -> None:
    worker = RuntimeError(
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/pyspark/worker.py", line 1900, in main\n'
        '  File "/home/me/pipelines/orders.py", line 12, in refuse\n'
        '  File "/venv/lib/python3.11/site-packages/onceflow/decoding/records.py", line 40, in decode\n'
        "ValueError: amount refused\n"
    )
    assert failure_line(worker) == "ValueError: amount refused (at /home/me/pipelines/orders.py:12 in refuse)"


def test_an_error_raised_here_names_its_type_and_the_innermost_frame_of_the_pipelines_code() -> None:
    def transform() -> None:
        raise ValueError("boom")

    try:
        transform()
    except ValueError as exc:
        line = failure_line(exc)
    assert line.startswith("ValueError: boom (at ") and line.endswith(" in transform)")
    assert "test_failures.py:" in line
    assert failure_line(ConfigError("bad setting")) == "ConfigError: bad setting"


def test_a_lost_spark_connect_server_is_its_grpc_status_and_details() -> None:
    lost = ConnectionError(
        "<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n"
        '\tdetails = "failed to connect to all addresses"\n\tdebug_error_string = "..."\n>'
    )
    assert failure_line(lost) == (
        'ConnectionError: status = StatusCode.UNAVAILABLE; details = "failed to connect to all addresses"'
    )


def test_a_spark_submit_output_gives_the_drivers_line_before_any_traceback_or_shutdown_line() -> None:
    stderr = (
        "Traceback (most recent call last):\n  ...\nValueError: boom\n"
        "[onceflow process] failed: ValueError: boom (at /p/orders.py:3 in enrich)\n"
        "INFO SparkContext: Successfully stopped SparkContext\n"
    )
    assert cause_in_output(stderr) == "ValueError: boom (at /p/orders.py:3 in enrich)"
    assert cause_in_output("WARN x\nKeyError: 'amount'\nINFO stopped\n") == "KeyError: 'amount'"
    assert cause_in_output("INFO only shutdown lines\n") == "INFO only shutdown lines"
