"""Markers: one small object per task attempt of a sink that stages its files in place (Iceberg, Delta,
files in a bucket), what makes those files "staged".

A marker is written when an attempt starts (an incomplete committable) and rewritten by its pre-commit
(the full committable), at ``{location}/{folder}/{pipeline}/{sink}/epoch={n}/{task}/attempt-{a}.json``.
The committer deletes it once the files are committed, abort deletes it with the files, and the sweeper
lists what is left (`list_markers`), so an attempt that died at any point is found.
"""

from __future__ import annotations

from onceflow.committables import Committable, TaskContext
from onceflow.names import check_name
from onceflow.storage.store import Store


def marker_root(location: str, folder: str, pipeline: str, sink: str) -> str:
    return f"{location.rstrip('/')}/{folder}/{check_name('pipeline', pipeline)}/{check_name('sink', sink)}"


def marker_uri(location: str, folder: str, c: TaskContext | Committable) -> str:
    """The marker of an attempt, in the sink's marker ``folder`` under ``location``."""
    check_name("task", c.task)
    check_name("attempt", c.attempt)
    root = marker_root(location, folder, c.pipeline, c.sink)
    return f"{root}/epoch={c.epoch}/{c.task}/attempt-{c.attempt}.json"


def list_markers(
    store: Store, location: str, folder: str, pipeline: str, sink: str | None
) -> list[Committable]:
    """Every attempt of the pipeline (of one sink if given) that has a marker: its committable, or an
    incomplete one rebuilt from the path (a marker cut short by a crash)."""
    found: list[Committable] = []
    root = f"{location.rstrip('/')}/{folder}/{check_name('pipeline', pipeline)}"
    if sink is not None:
        root += f"/{check_name('sink', sink)}"
    prefix = store.uri(store.path(root))
    for uri in store.files_under(root):
        parts = uri[len(prefix) :].strip("/").split("/")
        if sink is not None:
            parts = [sink, *parts]
        if len(parts) != 4:
            continue
        sink_name, epoch_part, task, name = parts
        if not (epoch_part.startswith("epoch=") and epoch_part[6:].isdigit()):
            continue
        if not (name.startswith("attempt-") and name.endswith(".json")):
            continue
        try:
            found.append(Committable.from_json(store.read(uri).decode()))
        except (ValueError, KeyError):
            found.append(
                Committable(
                    pipeline=pipeline,
                    epoch=int(epoch_part[6:]),
                    slice=-1,
                    task=task,
                    attempt=name.removeprefix("attempt-").removesuffix(".json"),
                    sink=sink_name,
                    handle={"incomplete": True},
                )
            )
    return found
