"""The postgres_2pc gid: deterministic, parseable back, within PostgreSQL's limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.errors import ConfigError
from onceflow.sinks.base import TaskContext
from onceflow.sinks.postgres_2pc import (
    GID_MAX_BYTES,
    GidParts,
    PostgresTwoPhaseWriter,
    gid_of,
    make_gid,
    parse_gid,
)

names = st.text(alphabet="abcXYZ019_.-", min_size=1, max_size=20).filter(lambda s: s not in {".", ".."})


@given(names, st.integers(0, 10**12), st.integers(0, 999), names, names, names)
def test_gid_round_trips(pipeline: str, epoch: int, slice_: int, sink: str, task: str, attempt: str) -> None:
    parts = GidParts(pipeline, epoch, slice_, sink, task, attempt)
    gid = make_gid(parts)
    assert gid.startswith("onceflow:")
    assert len(gid.encode()) <= GID_MAX_BYTES
    assert parse_gid(gid) == parts


def test_gid_depends_on_every_part_of_the_task() -> None:
    base = TaskContext("p", 3, 1, "s1-t0", "a1", "out")
    variants = [
        TaskContext("q", 3, 1, "s1-t0", "a1", "out"),
        TaskContext("p", 4, 1, "s1-t0", "a1", "out"),
        TaskContext("p", 3, 1, "s1-t1", "a1", "out"),
        TaskContext("p", 3, 1, "s1-t0", "a2", "out"),
        TaskContext("p", 3, 1, "s1-t0", "a1", "out2"),
    ]
    assert gid_of(base) == "onceflow:p:3:1:out:s1-t0:a1"
    assert len({gid_of(base), *(gid_of(v) for v in variants)}) == 6


def test_too_long_or_unsafe_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="bytes"):
        make_gid(GidParts("p" * 150, 1, 0, "sink", "t" * 50, "a"))
    with pytest.raises(ConfigError, match="pipeline"):
        make_gid(GidParts("a:b", 1, 0, "sink", "t", "a"))


@pytest.mark.parametrize("gid", ["other:p:1:0:s:t:a", "onceflow:p:x:0:s:t:a", "onceflow:p:1:0:s:t", "_tx_42"])
def test_foreign_gids_are_not_parsed(gid: str) -> None:
    assert parse_gid(gid) is None


class FailingConnection:
    """A connection in a two-phase transaction whose rollback fails, as when the server went away."""

    autocommit = False

    def __init__(self) -> None:
        self.closed = False

    def tpc_rollback(self) -> None:
        raise OSError("server closed the connection unexpectedly")

    def close(self) -> None:
        self.closed = True


def test_abort_closes_the_connection_even_when_the_rollback_fails() -> None:
    writer = PostgresTwoPhaseWriter(
        {"dsn": "postgresql://u@127.0.0.1:1/x", "table": "t", "columns": {"id": "bigint"}}
    )
    conn = FailingConnection()
    writer._conn, writer._task = conn, TaskContext("p", 3, 1, "s1-t0", "a1", "out")  # type: ignore[assignment]
    with pytest.raises(OSError, match="server closed"):
        writer.abort()
    assert conn.closed
