"""PostgreSQL sink with true two-phase commit (``PREPARE TRANSACTION`` / ``COMMIT PREPARED``).

The writer puts the task's rows and a marker row into one transaction and prepares it under a gid
derived from the task; the prepared transaction survives the writer's process and even a server restart.
The committer, in another process, runs ``COMMIT PREPARED``. After a commit the gid is gone, so the
committed marker row is the evidence that a retried commit has nothing left to do.

gid format: ``onceflow:{pipeline}:{epoch}:{slice}:{sink}:{task}:{attempt}`` (names may not hold ':'),
at most 199 bytes, the limit of PostgreSQL's gid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.names import check_name
from onceflow.sinks._arrow import exact_columns
from onceflow.sinks._config import ConfigReader
from onceflow.sinks._pg import (
    PG_TABLE_SETTINGS,
    NestedValues,
    PgTableConfig,
    RowDigest,
    column_list,
    create_table_if_missing,
    find_table,
    row_values,
    run_ddl,
    table_identifier,
    table_types,
)
from onceflow.sinks._pg_checks import pg_plan_checks
from onceflow.sinks._pg_csv import csv_payload
from onceflow.sinks.base import Committable, Row, TaskContext
from onceflow.sinks.errors import (
    AlreadyCommitted,
    ConflictingAttempt,
    StagedOutputLost,
    WriterStateError,
)
from onceflow.sinks.registry import SinkKind, SinkSetting, pg_defaults

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa

KIND = "postgres_2pc"
GID_PREFIX = "onceflow:"
GID_MAX_BYTES = 199
_TASK_KEY = "pipeline = %s AND epoch = %s AND sink = %s AND task = %s"
_MARKER_KEY = _TASK_KEY + " AND attempt = %s"


@dataclass(frozen=True)
class GidParts:
    pipeline: str
    epoch: int
    slice: int
    sink: str
    task: str
    attempt: str


def make_gid(parts: GidParts) -> str:
    """The deterministic gid of one task attempt; raises if the names make it too long for PostgreSQL."""
    for what in ("pipeline", "sink", "task", "attempt"):
        check_name(what, getattr(parts, what))
    if parts.epoch < 0 or parts.slice < 0:
        raise ConfigError(f"epoch and slice must be >= 0 in a gid, got {parts}")
    fields = (parts.pipeline, parts.epoch, parts.slice, parts.sink, parts.task, parts.attempt)
    gid = GID_PREFIX + ":".join(str(f) for f in fields)
    if len(gid.encode()) > GID_MAX_BYTES:
        raise ConfigError(
            f"transaction id {gid!r} is {len(gid.encode())} bytes, PostgreSQL allows {GID_MAX_BYTES}: "
            "shorten the pipeline, sink or task names"
        )
    return gid


def parse_gid(gid: str) -> GidParts | None:
    """The parts of an onceflow gid, or None for any other prepared transaction's gid."""
    if not gid.startswith(GID_PREFIX):
        return None
    fields = gid[len(GID_PREFIX) :].split(":")
    if len(fields) != 6 or not fields[1].isdigit() or not fields[2].isdigit():
        return None
    pipeline, epoch, slice_, sink, task, attempt = fields
    return GidParts(pipeline, int(epoch), int(slice_), sink, task, attempt)


def gid_of(c: Committable | TaskContext) -> str:
    return make_gid(GidParts(c.pipeline, c.epoch, c.slice, c.sink, c.task, c.attempt))


@dataclass(frozen=True)
class PostgresTwoPhaseConfig:
    """``dsn`` (default: the stack's), ``table``, ``columns`` (name -> SQL type), ``create_table``,
    ``marker_table`` (default ``onceflow_markers``), ``lock_timeout_ms`` (how long a task attempt waits
    for another attempt of the same task that holds the marker before giving up), ``name`` (the sink
    name, narrowing ``orphans``)."""

    table: PgTableConfig
    marker_table: str = "onceflow_markers"
    lock_timeout_ms: int = 10_000

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> PostgresTwoPhaseConfig:
        reader = ConfigReader(KIND, config)
        parsed = cls(
            table=PgTableConfig.read(reader),
            marker_table=reader.string("marker_table", "onceflow_markers"),
            lock_timeout_ms=reader.integer("lock_timeout_ms", 10_000, minimum=1),
        )
        reader.finish()
        return parsed


def _as_config(config: PostgresTwoPhaseConfig | Mapping[str, Any]) -> PostgresTwoPhaseConfig:
    if isinstance(config, PostgresTwoPhaseConfig):
        return config
    return PostgresTwoPhaseConfig.from_mapping(config)


def ensure_marker_table(conn: psycopg.Connection[Any], marker_table: str) -> None:
    """Create the marker table; one marker per task attempt, so that attempts never block each other."""
    from psycopg import sql

    table = table_identifier(marker_table)
    run_ddl(
        conn,
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, epoch bigint NOT NULL,"
            " sink text NOT NULL, task text NOT NULL, attempt text NOT NULL, record_count bigint NOT NULL,"
            " committed_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (pipeline, epoch, sink, task, attempt))"
        ).format(table),
    )
    old_key = conn.execute(
        "SELECT c.conname FROM pg_constraint c WHERE c.conrelid = to_regclass(%s) AND c.contype = 'p'"
        " AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.conrelid"
        " AND a.attnum = ANY(c.conkey) AND a.attname = 'attempt')",
        [table.as_string(conn)],
    ).fetchone()
    if old_key is not None:  # a table from before attempts had a marker each: widen its key
        run_ddl(
            conn,
            sql.SQL(
                "ALTER TABLE {} DROP CONSTRAINT {}, ADD PRIMARY KEY (pipeline, epoch, sink, task, attempt)"
            ).format(table, sql.Identifier(old_key[0])),
        )


class PostgresTwoPhaseWriter:
    """One connection per task attempt; the rows go in with COPY (rows as psycopg text, Arrow batches
    as CSV), the marker row first.

    Every attempt has its own marker, so a retried or speculative attempt stages its rows even while an
    earlier attempt of the task is prepared (perhaps by a process that died): the ledger accepts one of
    them and the others are rolled back. Only the same attempt id twice conflicts (`ConflictingAttempt`).
    """

    def __init__(self, config: PostgresTwoPhaseConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)
        self._conn: psycopg.Connection[Any] | None = None
        self._task: TaskContext | None = None
        self._digest = RowDigest()
        self._prepared = False
        self._nested: NestedValues | None = None  # the table's column types, read in begin()

    def begin(self, task: TaskContext) -> None:
        import psycopg
        from psycopg import errors, sql

        if self._task is not None:
            raise WriterStateError(f"{KIND} writer: begin() called twice (for {task.txn_id})")
        gid = gid_of(task)
        conn = psycopg.connect(self.config.table.dsn, autocommit=True)
        self._conn, self._task = conn, task
        if self.config.table.create_table:
            create_table_if_missing(conn, self.config.table)
        ensure_marker_table(conn, self.config.marker_table)
        table = self.config.table
        types = table_types(conn, table_identifier(table.table).as_string(conn))
        where = f"{KIND} sink {task.sink} table {table.table}"
        self._nested = NestedValues(table.column_names, types, where, dict(table.row_types))
        conn.autocommit = False
        conn.tpc_begin(gid)
        conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{self.config.lock_timeout_ms}ms"])
        try:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (pipeline, epoch, sink, task, attempt, record_count)"
                    " VALUES (%s, %s, %s, %s, %s, 0)"
                ).format(table_identifier(self.config.marker_table)),
                [task.pipeline, task.epoch, task.sink, task.task, task.attempt],
            )
        except (errors.UniqueViolation, errors.LockNotAvailable) as exc:
            self.abort()
            raise ConflictingAttempt(
                f"{task.txn_id}: this attempt of task {task.task} already prepared or committed its output"
            ) from exc
        conn.execute("SET LOCAL lock_timeout TO DEFAULT")

    def _require(self) -> tuple[psycopg.Connection[Any], TaskContext]:
        if self._conn is None or self._task is None or self._prepared:
            raise WriterStateError(f"{KIND} writer: write/pre_commit needs begin() first and no pre_commit()")
        return self._conn, self._task

    def _values(self) -> NestedValues:
        if self._nested is None:
            raise WriterStateError(f"{KIND} writer: write() needs begin() first")
        return self._nested

    def write(self, rows: Iterable[Row]) -> None:
        from psycopg import sql

        conn, _ = self._require()
        nested = self._values()
        names = self.config.table.column_names
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            table_identifier(self.config.table.table), column_list(names)
        )
        with conn.cursor() as cur, cur.copy(statement) as copy:
            for row in rows:
                values = nested.row(row_values(row, names, nested.where))
                copy.write_row(values)
                self._digest.add(values)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Stage an Arrow batch with one CSV COPY built column-wise (see `_pg_csv`): the rows that
        `write` would stage, without a Python object per value. The checksum takes the CSV bytes."""
        from psycopg import sql

        conn, _ = self._require()
        nested = self._values()
        names = self.config.table.column_names
        batch = exact_columns(batch, names, nested.where)
        if conn.info.encoding != "utf-8":  # the CSV is UTF-8; psycopg encodes rows for any encoding
            self.write(batch.to_pylist())
            return
        payload = csv_payload(batch, nested, conn)
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            table_identifier(self.config.table.table), column_list(names)
        )
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy.write(memoryview(payload))
        self._digest.add_encoded(memoryview(payload), batch.num_rows)

    def pre_commit(self) -> Committable:
        from psycopg import sql

        conn, task = self._require()
        conn.execute(
            sql.SQL("UPDATE {} SET record_count = %s WHERE " + _MARKER_KEY).format(
                table_identifier(self.config.marker_table)
            ),
            [self._digest.count, task.pipeline, task.epoch, task.sink, task.task, task.attempt],
        )
        conn.tpc_prepare()
        self._prepared = True
        conn.close()
        return Committable.for_task(
            task,
            handle={"gid": gid_of(task), "table": self.config.table.table},
            record_count=self._digest.count,
            checksum=self._digest.hexdigest(),
        )

    def abort(self) -> None:
        """Roll back this attempt's transaction, prepared or not; safe to call more than once."""
        if self._task is None:
            return
        conn = self._conn
        try:
            if self._prepared:
                PostgresTwoPhaseCommitter(self.config).abort([Committable.for_task(self._task)])
            elif conn is not None and not conn.closed and not conn.autocommit:
                conn.tpc_rollback()
        finally:  # a rollback that fails (the server gone) must not leak the connection as well
            if conn is not None and not conn.closed:
                conn.close()


class PostgresTwoPhaseCommitter:
    """COMMIT PREPARED / ROLLBACK PREPARED from any process; the marker row decides ambiguous cases."""

    def __init__(self, config: PostgresTwoPhaseConfig | Mapping[str, Any]) -> None:
        self.config = _as_config(config)

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        return psycopg.connect(self.config.table.dsn, autocommit=True)

    def _marker_attempt(self, conn: psycopg.Connection[Any], c: Committable) -> str | None:
        from psycopg import sql

        if find_table(conn, self.config.marker_table) is None:
            return None
        row = conn.execute(
            sql.SQL("SELECT attempt FROM {} WHERE " + _TASK_KEY).format(
                table_identifier(self.config.marker_table)
            ),
            [c.pipeline, c.epoch, c.sink, c.task],
        ).fetchone()
        return None if row is None else str(row[0])

    def _finish(self, conn: psycopg.Connection[Any], action: str, gid: str) -> bool:
        """Run COMMIT/ROLLBACK PREPARED; False when no such prepared transaction exists."""
        from psycopg import errors, sql

        try:
            conn.execute(sql.SQL(action + " PREPARED {}").format(sql.Literal(gid)))
        except errors.UndefinedObject:
            return False
        return True

    def commit(self, committables: Sequence[Committable]) -> None:
        """Commit each prepared transaction, unless a committed marker shows it (or a rival) done.

        Only committed markers are visible, and at most one attempt per task is ever committed: a marker
        of this attempt means "already committed", one of another attempt refuses the commit.
        """
        with self._connect() as conn:
            for c in committables:
                gid = gid_of(c)
                marker = self._marker_attempt(conn, c)
                if marker == c.attempt:
                    continue  # committed earlier: committing twice is committing once
                if marker is None and self._finish(conn, "COMMIT", gid):
                    continue
                if marker is None:
                    raise StagedOutputLost(
                        f"{KIND}: prepared transaction {gid!r} does not exist and no marker shows it "
                        "committed; the staged rows are gone (rolled back by someone else?), so the epoch "
                        "cannot be committed"
                    )
                raise ConflictingAttempt(
                    f"{KIND}: attempt {marker!r} of task {c.task} is committed; refusing to commit "
                    f"{gid!r} as well"
                )

    def abort(self, committables: Sequence[Committable]) -> None:
        """Roll back each prepared transaction; refuses output whose marker shows it committed."""
        with self._connect() as conn:
            for c in committables:
                gid = gid_of(c)
                if self._finish(conn, "ROLLBACK", gid):
                    continue
                if self._marker_attempt(conn, c) == c.attempt:
                    raise AlreadyCommitted(f"{KIND}: cannot abort {gid!r}: its output is already committed")

    def orphans(self, pipeline: str) -> list[Committable]:
        """Prepared onceflow transactions of the pipeline in this database (of this sink if named)."""
        check_name("pipeline", pipeline)
        with self._connect() as conn:
            gids = conn.execute(
                "SELECT gid FROM pg_prepared_xacts"
                " WHERE database = current_database() AND starts_with(gid, %s)",
                [f"{GID_PREFIX}{pipeline}:"],
            ).fetchall()
        found = []
        for (gid,) in gids:
            parts = parse_gid(str(gid))
            if parts is None or parts.pipeline != pipeline:
                continue
            if self.config.table.name is not None and parts.sink != self.config.table.name:
                continue
            found.append(
                Committable(
                    pipeline=parts.pipeline,
                    epoch=parts.epoch,
                    slice=parts.slice,
                    task=parts.task,
                    attempt=parts.attempt,
                    sink=parts.sink,
                    handle={"gid": gid},
                )
            )
        return sorted(found, key=lambda c: (c.epoch, c.sink, c.task, c.attempt))


SINK_KIND = SinkKind(
    name=KIND,
    writer=PostgresTwoPhaseWriter,
    committer=PostgresTwoPhaseCommitter,
    guarantee="exactly_once",
    defaults=pg_defaults,
    plan_checks=pg_plan_checks(lambda config: _as_config(config).table, prepares=True),
    settings=(
        *PG_TABLE_SETTINGS,
        SinkSetting(
            "marker_table",
            "string",
            "table of commit markers, one row per committed task attempt (created if missing); `name` or "
            "`schema.name`, quoted as `table` is",
            default="onceflow_markers",
        ),
        SinkSetting(
            "lock_timeout_ms",
            "integer",
            "how long a task attempt waits for another attempt of the same task that holds its marker",
            default=10_000,
            minimum=1,
        ),
    ),
)
