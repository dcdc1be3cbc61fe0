"""Why a slice failed, on one line: the first exception of the transform or a sink, with its frame.

A transform that raises on the driver, a UDF that raises on an executor (Spark wraps the worker's
traceback in its own exception), a sink that refuses a row, a Spark Connect server that went away: each
becomes ``Type: message (at file:line in function)``, the frame being the innermost one of the pipeline's
own code. That line is what the slice driver records as the epoch's abort reason, what the runner's
exception says and what the Airflow task logs last, instead of Spark's shutdown lines.
"""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path

from onceflow import redact

# A Python exception's last traceback line: "ValueError: boom", "pyspark.errors.PythonException: ...".
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Failed|Refused): .+")
_FRAME_LINE = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
# Frames of these are Spark's, Python's or onceflow's own: the pipeline's frame is the innermost other one.
_LIBRARY = str(Path(__file__).resolve().parents[1]) + os.sep
_NOT_THE_PIPELINES = ("/pyspark/", "/py4j/", "/site-packages/", "/lib/python3", "<frozen ", _LIBRARY)
# The process driver's line for a slice it gave up on, found in a spark-submit's output.
DRIVER_FAILED = "[onceflow process] failed: "
LIMIT = 500


def _pipeline_frame(frames: list[tuple[str, int, str]]) -> str:
    own = [f for f in frames if not any(part in f[0] for part in _NOT_THE_PIPELINES)]
    if not own:
        return ""
    file, line, function = own[-1]
    return f" (at {file}:{line} in {function})"


def failure_line(exc: BaseException) -> str:
    """One line for ``exc``: for an error raised in a Python worker, the worker traceback's own last
    line; for a lost Spark Connect server, the gRPC status and details; else the exception itself."""
    text = str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    raised = [line for line in lines if EXCEPTION_LINE.match(line)]
    grpc = [line for line in lines if line.startswith(("status = ", "details = "))]
    if raised:  # Spark carries the worker's traceback in its message
        head = raised[-1]
        frames = [
            (m["file"], int(m["line"]), m["function"]) for line in lines if (m := _FRAME_LINE.match(line))
        ]
    else:
        head = f"{type(exc).__name__}: " + ("; ".join(grpc) if grpc else lines[0] if lines else "")
        frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    return redact.text(head + _pipeline_frame(frames))[:LIMIT]


def cause_in_output(output: str, limit: int = LIMIT) -> str:
    """The cause a failed spark-submit slice job printed: the driver's own ``failed:`` line, else the
    first exception line of a traceback, else the tail (Spark prints its shutdown lines last).

    spark-submit passes the Python driver's stdout and stderr on as its own stdout, and its JVM's log
    as its stderr: give both."""
    lines = [line.strip() for line in output.splitlines()]
    for line in lines:
        if line.startswith(DRIVER_FAILED):
            return redact.text(line.removeprefix(DRIVER_FAILED))[:limit]
    for line in lines:
        if EXCEPTION_LINE.match(line) and not line.startswith(("py4j.", "org.apache")):
            return redact.text(line)[:limit]
    return redact.text(output.strip())[-limit:]
