"""The seam through which the CLI (and any coordinator process) gets committers for a pipeline's sinks.

The ledger knows sinks only by name. A `CommitterProvider` maps ``(pipeline, sink_name)`` to a
`SinkCommitter`; the sinks package supplies one from its registry of sink kinds. It is found, in order:

1. ``ONCEFLOW_COMMITTER_PROVIDER=package.module:callable`` in the environment (handy for a deployment or a
   test that runs the console script in a subprocess);
2. whatever was registered with `set_committer_provider` (e.g. by the sinks package when imported).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from onceflow.errors import ConfigError
from onceflow.ledger.errors import MissingCommitter
from onceflow.sinks.base import SinkCommitter

CommitterProvider = Callable[[str, str], SinkCommitter]
ENV_VAR = "ONCEFLOW_COMMITTER_PROVIDER"

_registered: CommitterProvider | None = None


def set_committer_provider(provider: CommitterProvider | None) -> None:
    """Install (or with None remove) the process-wide provider."""
    global _registered
    _registered = provider


def _resolve(path: str) -> CommitterProvider:
    from onceflow.pipeline import import_dotted

    try:
        obj = import_dotted(path)
    except ConfigError as exc:
        raise ConfigError(f"{ENV_VAR}: {exc}") from exc
    if not callable(obj):
        raise ConfigError(f"{ENV_VAR}={path!r}: not callable")
    provider: CommitterProvider = obj
    return provider


def committer_provider(env: Mapping[str, str] | None = None) -> CommitterProvider:
    env = os.environ if env is None else env
    path = env.get(ENV_VAR)
    if path:
        return _resolve(path)
    if _registered is not None:
        return _registered
    raise MissingCommitter(
        f"no committer provider: set {ENV_VAR}=package.module:callable, or call "
        "onceflow.ledger.set_committer_provider() before committing, aborting or recovering"
    )


def committers_for(
    provider: CommitterProvider, pipeline: str, sinks: Sequence[str]
) -> dict[str, SinkCommitter]:
    return {sink: provider(pipeline, sink) for sink in sinks}
