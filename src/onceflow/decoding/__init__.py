"""Records into rows: the JSON and Avro decoders, and the schema registry the Avro decoder asks.

Runs wherever records are decoded (the local executor, spark-submit tasks, the warm runtime's Python
workers), so nothing here imports the ledger or the protocol. Every record gives exactly one row or one
dead letter with its reason (`records.DeadLetter`).
"""
