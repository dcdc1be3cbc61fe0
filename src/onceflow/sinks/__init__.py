"""Sinks as two halves (writer in the Spark task, committer in the coordinator); see `base`."""
