"""What an operator watches from outside the protocol: dead letters, an epoch's metrics, lineage, and
whether a topic holds records beyond a pipeline's committed position.

Read-only over the ledger and Kafka: nothing here changes an epoch.
"""
