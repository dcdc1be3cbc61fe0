"""What runs inside Spark tasks (or the local executor's loop): exact reads, decoding, sink writers.

This package is the executor side of the boundary. It imports nothing of the ledger or the coordinator:
a read task returns its rows and dead letters, a write task returns its committable (Flink's
``CommittingSinkWriter.prepareCommit()``), and the slice's driver registers them in the ledger in one
transaction and decides which attempt of each task wins (Spark's ``OutputCommitCoordinator``).
"""
