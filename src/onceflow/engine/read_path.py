"""Which of the two reads (`onceflow.engine.jvm_read`) a slice takes, and why.

The JVM path where it can: it decodes in Spark what its checks (`onceflow.engine.jvm_checks`) prove
good. The Python path when a fault plan is armed (crash and pause points such as ``task_mid_read`` live
in the Python reader), when the session cannot load Spark's Kafka source (a spark-submit driver without
its jar), for a schema whose field names contain the control character the JVM checks reserve, and for
Avro when the session has no spark-avro or no writer schema of the slice can be decoded in the JVM.
JSON reads in Python unless the settings choose the JVM (`Settings.json_read`), and also where the
schema has a timestamp, date, decimal, bytes or json field (the JVM checks decode structs, arrays and
maps of strings, ints, floats and bools).

The reason travels with the read, so the slice's log says which path it took and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onceflow.decoding.avro_records import registry_for
from onceflow.engine.jvm_avro import WriterPlan, writer_plans
from onceflow.engine.jvm_checks import (
    avro_functions_missing,
    jvm_decodable,
    kafka_source_missing,
    reserved_field_name,
    slice_ranges,
)
from onceflow.engine.jvm_read import jvm_read, python_read, task_kafka_frame
from onceflow.executor.slices import SliceRef
from onceflow.faults import plan_armed
from onceflow.pipeline import AvroFormat, JsonFormat
from onceflow.sources.kafka_planning import ReadTask

PYTHON, JVM = "python", "jvm"


@dataclass
class DecodedRead:
    """The slice's decoded records as one DataFrame (partition i is read task i, in offset order), and
    which path produced it, with why."""

    frame: Any
    path: str
    reason: str
    # The inputs of its physical plan: one Kafka scan per read task on the JVM path, one range on the
    # Python path. The one-pass check compares a transform's plan with it, without a second explain.
    leaves: int = 1


def decoded_read(spark: Any, ref: SliceRef, tasks: Sequence[ReadTask]) -> DecodedRead:
    """The slice's records, rows and dead letters together, one Spark partition per read task.

    The path rule: Python when a fault plan is armed, for JSON unless the settings choose the JVM
    (`Settings.json_read`; a schema name holding the reserved character keeps it in Python), and for
    Avro of which no writer schema can be decoded in the JVM; else the JVM, unless the session has no
    Kafka source, or no spark-avro for Avro (then Python, and the reason says so).
    """
    fmt = ref.pipeline.format
    reason = None
    plans: list[WriterPlan] = []
    if plan_armed():  # crash and pause points sit in the Python reader
        reason = "a fault plan is armed"
    elif isinstance(fmt, JsonFormat | AvroFormat) and fmt.changes is not None:
        reason = "change events are read in Python"
    elif isinstance(fmt, JsonFormat) and ref.task.json_read == "python":
        reason = "ONCEFLOW_JSON_READ=python, the default"
    elif isinstance(fmt, JsonFormat) and reserved_field_name(fmt):
        reason = "a schema field name holds U+0001"
    elif isinstance(fmt, JsonFormat) and (kept := jvm_decodable(fmt)) is not None:
        reason = f"the schema has a field of type {kept}, which the JVM checks do not decode"
    elif isinstance(fmt, AvroFormat):
        registry = (
            registry_for(ref.task.schema_registry_url, ref.task.schema_registry_allow_insecure_auth)
            if fmt.wire == "registry"
            else None
        )
        topics = sorted({r.topic for r in ref.slice_ranges})
        plans, notes = writer_plans(fmt, registry, topics)
        if not plans:
            why = f": {notes[0]}" if notes else ""
            reason = f"no writer schema of the Avro records can be decoded in the JVM{why}"
    if reason is None:
        slice_ranges(ref, tasks)  # the tasks cover exactly the slice's ranges
        kafka, reason = kafka_source_missing(lambda: task_kafka_frame(spark, ref.bootstrap, tasks), spark)
        if reason is None and not isinstance(fmt, AvroFormat):
            frame, _ = jvm_read(kafka, ref)
            return DecodedRead(frame, JVM, "Spark's Kafka source and from_json", len(tasks))
        if reason is None:
            read, reason = avro_functions_missing(lambda: jvm_read(kafka, ref, plans)[0], spark)
            if reason is None:
                how = f"Spark's Kafka source and from_avro ({len(plans)} writer schemas)"
                return DecodedRead(read, JVM, how, len(tasks))
    return DecodedRead(python_read(spark, ref, tasks), PYTHON, reason)
