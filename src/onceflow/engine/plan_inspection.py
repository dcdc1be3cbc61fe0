"""What a query's physical plan says about its partitions, read without running a job.

A slice writes in the read's own tasks (one pass) only when output partition i still holds read task i's
records in their order; otherwise each sink's output is repartitioned to one partition per task. Both
decisions come from the plan Spark prints (`physical_plan`) or from the planner (`output_partitions`),
on a classic session and on Spark Connect alike.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# Physical operators after which an output partition is no longer one read task's records in order:
# every exchange (a shuffle, a broadcast that runs a job of its own, a reused one), partitions merged
# or multiplied without one, and subqueries (jobs of their own).
_PARTITION_BREAKERS = frozenset(
    {"Exchange", "BroadcastExchange", "ReusedExchange", "Coalesce", "CartesianProduct", "Subquery"}
)
_PLAN_LINE = re.compile(r"^(?P<indent>[\s:|+\-]*)(?:\*\(\d+\)\s+)?(?P<name>[A-Za-z]\w*)")


def physical_plan(frame: Any) -> str:
    """The query's physical plan as Spark prints it (``explain``'s simple mode), on either kind of
    session: a classic one plans it in this JVM, a Spark Connect one asks the server (no job runs)."""
    if type(frame).__module__.startswith("pyspark.sql.connect"):
        return str(frame._explain_string(mode="simple"))
    jvm = frame.sparkSession._jvm
    return str(jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), "simple"))


def plan_operators(plan: str) -> list[tuple[int, str]]:
    """(depth, operator name) of each operator line of a printed physical plan, top down."""
    found = []
    for line in plan.splitlines():
        if not line.strip() or line.startswith("=="):
            continue
        match = _PLAN_LINE.match(line)
        if match:
            found.append((len(match.group("indent")), match.group("name")))
    return found


def plan_leaves(operators: Sequence[tuple[int, str]]) -> list[str]:
    """The operators with no child: each is followed by one no deeper than itself, or by none."""
    return [
        name
        for i, (depth, name) in enumerate(operators)
        if i + 1 == len(operators) or operators[i + 1][0] <= depth
    ]


def partition_refusal(frame: Any, read_leaves: int) -> str | None:
    """Why ``frame``'s partitions may not be the read's, or None when output partition i holds read
    task i's records in their order.

    That holds when its physical plan has the read's ``read_leaves`` leaves (`DecodedRead.leaves`) and
    none of `_PARTITION_BREAKERS`: then every operator between them is narrow.
    """
    operators = plan_operators(physical_plan(frame))
    breakers = sorted({name for _, name in operators} & _PARTITION_BREAKERS)
    if breakers:
        return f"the transform's plan has {', '.join(breakers)}"
    leaves = plan_leaves(operators)
    if len(leaves) != read_leaves:
        return f"the transform's plan reads {len(leaves)} inputs, the slice {read_leaves}"
    return None


def output_partitions(frame: Any) -> int | None:
    """How many partitions a DataFrame's query has, when the session can tell without running it.

    A classic session plans it (``DataFrame.rdd``); a Spark Connect session has no RDDs, so the
    count is unknown there and the writer repartitions to one partition per task.
    """
    from pyspark.errors import PySparkNotImplementedError

    try:
        return int(frame.rdd.getNumPartitions())
    except PySparkNotImplementedError:  # a Spark Connect DataFrame
        return None
