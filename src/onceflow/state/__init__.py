"""Keyed state: the snapshot store (`store`) and the Spark fold of an epoch into it (`fold`)."""

from onceflow.state.store import committed_state_files, state_root, state_sink

__all__ = ["committed_state_files", "state_root", "state_sink"]
