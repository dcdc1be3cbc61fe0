"""The epoch engine: plan an epoch, process a slice in Spark, coordinate the commit.

`planning` runs in the orchestrator before any processing, `slice_job` is the Spark driver of one slice,
`task_io` holds what its executors run, and `runner` chains the steps without Airflow (the DAG factory
runs the same functions as tasks).
"""
