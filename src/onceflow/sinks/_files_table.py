"""What a `files` sink table is, wherever it lives: its config and its commit log.

Shared by the local folder variant (`onceflow.sinks.files`) and the object-store one
(`onceflow.sinks._files_objects`), so both write, judge and read one log format: a table is the files its
log entries add minus those later entries remove, applied in epoch order (`live_files`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.names import check_name
from onceflow.sinks._arrow import declared_type
from onceflow.sinks._config import ConfigReader, take_s3
from onceflow.sinks.base import Committable
from onceflow.sinks.errors import ConflictingAttempt
from onceflow.sinks.staging import safe_relative
from onceflow.storage.s3 import S3Settings, is_s3, join, split

if TYPE_CHECKING:
    import pyarrow as pa

KIND = "files"
LOG_DIR = "_onceflow_log"
MODES = ("append", "replace")


@dataclass(frozen=True)
class FilesConfig:
    """``root`` (folder, or ``s3://bucket/prefix`` URL), ``table`` (folder name under root), ``columns``
    (optional name -> Arrow type alias such as ``int64`` or ``string``, or a type text of
    `onceflow.schemas` such as ``array<struct<sku:string,qty:int>>`` or ``map<string,int>?``; inferred
    from the rows when absent; an alias keeps Arrow's meaning, so ``float`` there is Arrow's float32),
    ``batch_size`` (rows per Parquet row group), ``mode`` ("append" or "replace": whether an epoch's
    commit keeps or replaces what the table holds), ``name`` (the sink name, narrowing ``orphans``), and
    ``s3``: the object store's settings for an ``s3://`` root, which onceflow puts in the config (no key a
    user writes)."""

    root: str
    table: str
    columns: tuple[tuple[str, str], ...] = ()
    batch_size: int = 10_000
    mode: str = "append"
    name: str | None = None
    s3: S3Settings | None = None

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> FilesConfig:
        s3: S3Settings | None = None
        if isinstance(config, Mapping) and "s3" in config:
            config, s3 = take_s3(config, KIND)
        reader = ConfigReader(KIND, config)
        in_bucket = is_s3(config.get("root"))
        parsed = cls(
            # a bucket's URL is taken as it is; only a local folder is made absolute
            root=reader.string("root").rstrip("/") if in_bucket else reader.path("root"),
            table=check_name("files sink config table", reader.string("table")),
            columns=reader.columns(required=False),
            batch_size=reader.integer("batch_size", 10_000, minimum=1),
            mode=reader.string("mode", "append"),
            name=reader.optional_string("name"),
            s3=s3 if in_bucket else None,
        )
        if parsed.mode not in MODES:
            raise ConfigError(f"files sink config mode={parsed.mode!r}: expected one of {MODES}")
        if in_bucket:
            split(parsed.root)  # refuses a URL without a bucket
            if s3 is None:
                raise ConfigError(
                    f"files sink config root={parsed.root!r}: an s3:// root needs the object store's "
                    "settings under 's3'; build the config with SinkKind.config_for(sink, settings), "
                    "which fills them from the AWS_* variables"
                )
        elif s3 is not None:
            raise ConfigError("files sink config: 's3' settings are for an s3:// root, and root is a folder")
        parsed.arrow_schema()
        reader.finish()
        return parsed

    def arrow_schema(self) -> pa.Schema | None:
        if not self.columns:
            return None
        import pyarrow as pa

        where = "files sink config columns"
        return pa.schema([pa.field(n, declared_type(text, f"{where}: {n}")) for n, text in self.columns])

    @property
    def in_bucket(self) -> bool:
        return is_s3(self.root)

    @property
    def table_dir(self) -> Path:
        """The table's local folder (a local root only)."""
        return Path(self.root) / self.table

    @property
    def table_uri(self) -> str:
        """The table's location as a URI or path: ``{root}/{table}``."""
        return join(self.root, self.table)

    @property
    def where(self) -> str:
        return f"{KIND} sink table {self.table}"


def as_config(config: FilesConfig | Mapping[str, Any]) -> FilesConfig:
    return config if isinstance(config, FilesConfig) else FilesConfig.from_mapping(config)


def log_entry_name(epoch: int) -> str:
    """An entry's name in ``{table}/_onceflow_log/``: zero-padded, so name order is epoch order."""
    return f"{int(epoch):020d}.json"


def is_log_entry_name(name: str) -> bool:
    """Whether a file of the log folder is an entry (not the temporary file of an interrupted write)."""
    stem = name.removesuffix(".json")
    return name.endswith(".json") and stem.isdigit()


@dataclass(frozen=True)
class CommitLogEntry:
    """One committed epoch of a table: files (relative to the table folder) it adds and removes."""

    epoch: int
    pipeline: str
    sink: str
    adds: tuple[str, ...]
    removes: tuple[str, ...] = ()
    record_count: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "epoch": self.epoch,
                "pipeline": self.pipeline,
                "sink": self.sink,
                "adds": list(self.adds),
                "removes": list(self.removes),
                "record_count": self.record_count,
            },
            sort_keys=True,
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> CommitLogEntry:
        """An entry as written by `to_json`; a file name that would lead outside the table (``..``, an
        absolute path) is refused, since readers open and compaction deletes the files named."""
        data = json.loads(text)
        epoch = int(data["epoch"])
        where = f"{KIND}: commit log entry of epoch {epoch}"
        return cls(
            epoch=epoch,
            pipeline=data["pipeline"],
            sink=data["sink"],
            adds=tuple(safe_relative(f"{where} adds", name) for name in data["adds"]),
            removes=tuple(safe_relative(f"{where} removes", name) for name in data.get("removes", ())),
            record_count=int(data.get("record_count", 0)),
        )

    def check_owner(self, other: CommitLogEntry, table: str) -> None:
        """Refuse to write this entry where ``other`` is, unless both are of one (pipeline, sink): a
        table belongs to one sink of one pipeline, and another's epoch is not this one's to decide."""
        if (other.pipeline, other.sink) != (self.pipeline, self.sink):
            raise ConflictingAttempt(
                f"{KIND}: table {table} epoch {self.epoch} was committed by "
                f"{other.pipeline}/{other.sink}, not {self.pipeline}/{self.sink}"
            )

    def check_done_by(self, other: CommitLogEntry, table: str) -> None:
        """``other``, the entry found where this one was to be put, already made this commit: same
        pipeline and sink, and it names every file this one adds (a retry; a racing committer; the
        sweeper committing one winner of a committed epoch again, whose entry names every winner's).
        Else a `ConflictingAttempt`: the epoch's output is decided, and this attempt's file is not in
        it."""
        self.check_owner(other, table)
        missing = sorted(set(self.adds) - set(other.adds))
        if missing:
            raise ConflictingAttempt(
                f"{KIND}: table {table} epoch {self.epoch} was committed with other files "
                f"({', '.join(other.adds) or 'none'}), not {', '.join(missing)}"
            )


def live_files(entries: Iterable[CommitLogEntry]) -> list[str]:
    """Every entry's adds minus later removes, in commit order (relative names): the reader rule."""
    live: dict[str, None] = {}
    for entry in entries:
        for name in entry.removes:
            live.pop(name, None)
        for name in entry.adds:
            live[name] = None
    return list(live)


def removes_for(earlier: Sequence[CommitLogEntry], mode: str, replaces: Iterable[int]) -> tuple[str, ...]:
    """What an epoch's entry removes, given the entries before it: in replace mode everything live; a
    replacement of earlier epochs (a re-run data interval) drops what those epochs added."""
    live = live_files(earlier)
    if mode == "replace":
        return tuple(live)
    replaced = {name for e in earlier if e.epoch in set(replaces) for name in e.adds}
    return tuple(n for n in live if n in replaced)


def by_epoch(committables: Sequence[Committable]) -> dict[int, list[Committable]]:
    groups: dict[int, list[Committable]] = {}
    for c in sorted(committables, key=lambda c: (c.epoch, c.task)):
        groups.setdefault(c.epoch, []).append(c)
    return groups
