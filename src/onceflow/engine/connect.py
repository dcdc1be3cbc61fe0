"""The process step as a Spark Connect client: slices sent to a long-lived Spark Connect server.

spark-submit starts a JVM for every slice of every epoch. With a Spark Connect server configured
(`Settings.spark_remote`, from ``ONCEFLOW_SPARK_REMOTE``: the ``sc://host:port`` that ``infra/spark.sh
start`` prints), the caller's process is the slice's driver instead: it runs the very steps of
`onceflow.engine.slice_job` on one Spark Connect session, kept warm across slices and epochs, and keeps
the ledger connection and the committables to itself as before.

What the server's Python workers need from the pipeline:
- onceflow itself is installed beside them (the runtime's Python is the project's virtualenv);
- the pipeline's own modules (its spec, its transform, a sink kind of its own, and what they use that
  is not installed) are not: they travel with the session as a Spark Connect artifact, one zip of their
  top-level packages' sources, added once per session (again when they change).

Every process that runs slices of one pipeline with the same modules joins one session on the server
(its id derived from the pipeline's name and the modules' content) instead of opening its own. Spark
4.1 gives every session that runs Python a Python daemon per executor and keeps it until the executor
stops (SPARK-54055), so a session per Airflow task grew a long-lived runtime by a daemon per executor
per task; the runtime's daemon (`onceflow.engine.python_daemon`) now also exits once idle. A joined
session is never released by a client, since others use it; the server closes it once idle for
``spark.connect.session.manager.defaultSessionTimeout``, and a closed id is never valid again, so the
clients then move on to the next generation's id. A change of the modules is a new session: a reused
Python worker never runs an old version of them.

Every slice's queries carry one tag. A slice that fails, or is interrupted, interrupts its tagged
queries; a client killed outright leaves its queries detached, and the server interrupts detached
queries after ``spark.connect.execute.manager.detachedTimeout`` (set by ``infra/spark.sh``). Either way
what the tasks staged is rolled back by ``abort`` or swept by ``recover``, as after a failed spark-submit.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from onceflow import redact
from onceflow.engine.failures import failure_line
from onceflow.engine.slice_job import SLICE_SQL_CONF, SessionFor, log
from onceflow.errors import ConfigError
from onceflow.executor.slices import SliceRef
from onceflow.pipeline import Pipeline

# Installed in the runtime but not under this Python's prefix (an editable install): never shipped,
# a second copy would shadow the first. Everything under the prefix (site-packages) is installed too.
INSTALLED_PACKAGES = frozenset({"onceflow"})
# How a Python traceback ends: "ValueError: boom", "pkg.module.SliceFailed: why".
# Retries of a call to the server: 0.1 s doubling up to 5 s, 8 times (about 20 s in all).
RETRY_POLICY: dict[str, Any] = {
    "max_retries": 8,
    "initial_backoff": 100,
    "backoff_multiplier": 2.0,
    "max_backoff": 5000,
}
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so that the same sources make the same zip and the same name
# Joined sessions' ids: uuid5 of the pipeline, its modules' bundle and a generation, in this namespace.
_SESSION_NAMESPACE = uuid.UUID("6f1c3d2a-9b7e-5c41-8a0d-0f5e2b7c9d13")
# Generations tried before giving up on joining (each closed one costs a round trip).
_MAX_GENERATIONS = 64


def slice_tag(pipeline: str, epoch: int, slice_number: int, attempt_token: str) -> str:
    """The tag of one slice attempt's queries: readable, unique per attempt, and a valid Spark tag
    (no commas)."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in pipeline)
    return f"onceflow-{name}-e{epoch}-s{slice_number}-{attempt_token[:12]}"


def pipeline_modules(spec: Pipeline, pipeline_path: str | None = None) -> list[str]:
    """The pipeline's own modules, which the server's Python workers may import: the spec's module,
    the transform's and any sink kind named ``package.module:attribute``; onceflow's are installed."""
    named = [pipeline_path, spec.transform, *(sink.kind for sink in spec.sinks)]
    modules = []
    for dotted in named:
        if not dotted or ":" not in dotted:
            continue
        module = dotted.split(":", 1)[0]
        if module.split(".")[0] not in INSTALLED_PACKAGES and module not in modules:
            modules.append(module)
    return modules


def _installed(top: str) -> bool:
    """Whether the runtime's Python has this top-level package already: onceflow, or anything that
    lives in this Python's installation (the standard library, site-packages). A name that is no
    importable package (an extension's internal module name, ``__main__``) is not shipped either."""
    if top in INSTALLED_PACKAGES or top in sys.builtin_module_names:
        return True
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return True
    if found is None:
        return True
    places = list(found.submodule_search_locations or []) or [found.origin or ""]
    prefixes = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return all(
        place in ("built-in", "frozen") or any(str(Path(place).resolve()).startswith(p) for p in prefixes)
        for place in places
    )


def own_packages(modules: Iterable[str]) -> list[str]:
    """The top-level packages to ship: those of ``modules`` and, transitively, of the modules and
    objects their loaded modules refer to, unless the runtime has them installed."""
    todo = [importlib.import_module(m).__name__.split(".")[0] for m in modules]
    found: list[str] = []
    while todo:
        top = todo.pop(0)
        if top in found or _installed(top):
            continue
        found.append(top)
        for name, module in list(sys.modules.items()):
            if module is None or (name != top and not name.startswith(top + ".")):
                continue
            for value in list(vars(module).values()):
                ref = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
                if isinstance(ref, str) and ref:
                    todo.append(ref.split(".")[0])
    return found


def module_sources(packages: Iterable[str]) -> dict[str, Path]:
    """Every source file of the top-level packages, by its path inside a zip on ``sys.path`` (a module
    that is no package ships alone)."""
    sources: dict[str, Path] = {}
    for top in packages:
        found = importlib.util.find_spec(top)
        if found is None:
            raise ConfigError(f"module {top!r} of the pipeline cannot be imported here; check PYTHONPATH")
        if found.submodule_search_locations:
            for location in found.submodule_search_locations:
                root = Path(location)
                for path in sorted(root.rglob("*.py")):
                    if "__pycache__" not in path.parts:
                        sources[str(Path(top, path.relative_to(root)))] = path
        elif found.origin and found.origin.endswith(".py"):
            sources[Path(found.origin).name] = Path(found.origin)
        else:
            raise ConfigError(f"module {top!r} of the pipeline is not Python source ({found.origin})")
    return sources


def module_bundle(packages: Iterable[str], folder: Path) -> Path | None:
    """A zip of the packages' sources, named by its content (so a changed module is a new artifact)."""
    sources = module_sources(packages)
    if not sources:
        return None
    contents = {name: path.read_bytes() for name, path in sorted(sources.items())}
    digest = hashlib.sha256()
    for name, data in contents.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    target = folder / f"onceflow-modules-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as bundle:
            for name, data in contents.items():
                bundle.writestr(zipfile.ZipInfo(name, _ZIP_TIME), data)
        partial.replace(target)
    return target


@dataclass
class _WarmSession:
    session: Any
    joined: bool = False  # one shared by every process of the pipeline: never released by this one
    shipped: set[str] = field(default_factory=set)


# This process's sessions by remote and key ("" for a private session, else the joined session's key).
_sessions: dict[tuple[str, str], _WarmSession] = {}
_lock = threading.Lock()


def joined_session_id(key: str, generation: int = 0) -> str:
    """The id every process joining ``key`` (pipeline and modules) uses, for one generation."""
    return str(uuid.uuid5(_SESSION_NAMESPACE, f"{key}\0{generation}"))


def _with_session_id(remote: str, session_id: str) -> str:
    """``remote`` asking for the session ``session_id``, unless the URL names a session itself."""
    if "session_id=" in remote:
        return remote
    return (
        f"{remote};session_id={session_id}"
        if "/;" in remote
        else f"{remote.rstrip('/')}/;session_id={session_id}"
    )


def _open(url: str) -> Any:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    session = SparkSession.builder.remote(url).create()
    # The client's default retries wait up to 10 minutes for a server that went away; a slice gives up
    # after about 20 s instead, so that its epoch aborts (and is replayed) rather than hangs.
    session.client.set_retry_policies([DefaultPolicy(**RETRY_POLICY)])
    return session


def _new_session(remote: str, key: str) -> _WarmSession:
    """A private session (``key`` empty), or the session of ``key`` joined at its first open generation."""
    if not key:
        log(f"opening a Spark Connect session on {redact.url(remote)}")
        warm = _WarmSession(_open(remote))
        atexit.register(_release, warm.session)
        _configure(warm)
        return warm
    for generation in range(_MAX_GENERATIONS):
        session_id = joined_session_id(key, generation)
        warm = _WarmSession(_open(_with_session_id(remote, session_id)), joined=True)
        try:
            _configure(warm)  # the first round trip: creates the session, or finds it closed
        except Exception as exc:
            _close(warm.session, release=False)
            if "SESSION_CLOSED" not in str(exc):
                raise
            continue
        log(f"joined the Spark Connect session {session_id} on {redact.url(remote)}")
        return warm
    raise ConfigError(
        f"the Spark Connect server on {redact.url(remote)} has closed the first {_MAX_GENERATIONS} "
        f"session ids of {key!r}; restart it (infra/spark.sh restart)"
    )


def _release(session: Any) -> None:
    """Release a session on the server (its cache, its artifacts); best effort, it may be gone."""
    _close(session, release=True)


def _close(session: Any, *, release: bool) -> None:
    """Stop a session: it stops being pyspark's default and active one, so that the next one is.
    Without ``release`` the server is not asked (it may be gone: each call would wait for retries)."""
    session.release_session_on_close = release
    with suppress(Exception):  # the server is gone or the session expired: nothing left to release
        session.stop()


def _configure(warm: _WarmSession) -> None:
    for key, value in SLICE_SQL_CONF.items():
        warm.session.conf.set(key, value)


def warm_session(remote: str, key: str = "") -> _WarmSession:
    """This process's session on ``remote`` (``key``: the shared session of a pipeline and its modules;
    empty: a private one), reused across slices; another when it stopped working (the server
    restarted, or the session expired)."""
    with _lock:
        warm = _sessions.get((remote, key))
        if warm is not None:
            try:
                _configure(warm)  # one round trip, which also proves the session is still there
                return warm
            except Exception as exc:
                log(
                    f"the Spark Connect session on {redact.url(remote)} is gone ({failure_line(exc)}); "
                    "opening another"
                )
                _close(warm.session, release=False)
                del _sessions[(remote, key)]
        warm = _new_session(remote, key)
        _sessions[(remote, key)] = warm
        return warm


def open_sessions(remote: str) -> list[Any]:
    """The sessions this process holds on ``remote``."""
    with _lock:
        return [warm.session for (where, _), warm in _sessions.items() if where == remote]


def forget_session(remote: str, *, release: bool = True) -> None:
    """Drop this process's sessions on ``remote``; the next slice opens (or joins) another. ``release``
    asks the server to free a private one; without, the connection is only closed (the server may be
    gone). A joined session is never released: other processes use it."""
    with _lock:
        dropped = [_sessions.pop(k) for k in [k for k in _sessions if k[0] == remote]]
    for warm in dropped:
        _close(warm.session, release=release and not warm.joined)


@dataclass(frozen=True)
class _Bundle:
    packages: list[str]
    path: Path | None


def _bundle(modules: list[str]) -> _Bundle:
    packages = own_packages(modules)
    return _Bundle(
        packages, module_bundle(packages, Path(tempfile.gettempdir()) / f"onceflow-artifacts-{os.getuid()}")
    )


def _ship_modules(warm: _WarmSession, bundle: _Bundle) -> None:
    if bundle.path is None or bundle.path.name in warm.shipped:
        return
    log(f"adding the pipeline's packages {bundle.packages} to the session as {bundle.path.name}")
    warm.session.addArtifacts(str(bundle.path), pyfile=True)
    warm.shipped.add(bundle.path.name)


def server_unreachable(exc: BaseException) -> bool:
    """Whether a failure says that the server cannot be reached (gone, or restarting): then nothing is
    left to interrupt there, and asking would only wait for the client's retries."""
    return "StatusCode.UNAVAILABLE" in str(exc)


# The session of each slice running in this process, by its tag: what `interrupt_slice` stops.
_RUNNING: dict[str, Any] = {}


def interrupt_slice(tag: str) -> None:
    """Interrupt the queries of the slice tagged ``tag`` (`slice_tag`), if it runs here: its deadline
    passed, and the thread that waits for them is abandoned."""
    spark = _RUNNING.get(tag)
    if spark is not None:
        stopped = spark.interruptTag(tag)
        log(f"{tag}: past its deadline, {len(stopped)} queries interrupted")


def connect_sessions(remote: str, modules: list[str], attempt_token: str) -> SessionFor:
    """Sessions for `slice_job.run_slice` on the Spark Connect server at ``remote``: the warm session,
    with the pipeline's modules added and the slice's queries tagged."""

    bundles: list[_Bundle] = []  # built by the first slice, once the modules are importable here

    @contextmanager
    def session_for(spec: Pipeline, ref: SliceRef) -> Iterator[Any]:
        if not bundles:
            bundles.append(_bundle(modules))
        bundle = bundles[0]
        warm = warm_session(remote, f"{spec.name}\0{bundle.path.name if bundle.path else ''}")
        _ship_modules(warm, bundle)
        spark = warm.session
        tag = slice_tag(spec.name, ref.epoch, ref.slice, attempt_token)
        spark.addTag(tag)
        _RUNNING[tag] = spark
        try:
            yield spark
        except BaseException as failure:
            _interrupt(remote, spark, tag, failure)
            raise
        finally:
            _RUNNING.pop(tag, None)
            with suppress(Exception):  # a client already closed by _interrupt
                spark.removeTag(tag)

    return session_for


def _interrupt(remote: str, spark: Any, tag: str, failure: BaseException) -> None:
    """Stop whatever the failed slice still runs; a session that cannot even do that is dropped."""
    if server_unreachable(failure):
        log(f"the Spark Connect server on {redact.url(remote)} is unreachable; dropping the session")
        forget_session(remote, release=False)
        return
    try:
        stopped = spark.interruptTag(tag)
        if stopped:
            log(f"interrupted {len(stopped)} queries of {tag}")
    except Exception as exc:
        log(f"could not interrupt {tag} ({failure_line(exc)}); dropping the session")
        forget_session(remote, release=False)
