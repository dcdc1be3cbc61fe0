"""onceflow for Airflow: a ledger hook, one operator per epoch step, and the DAG factory.

Thin on purpose: every operator calls a method of `onceflow.protocol.coordinator.Coordinator`, which the
runner and the `onceflow` CLI call too, so a DAG task, a script and a person at a terminal do exactly the same
thing.
"""
