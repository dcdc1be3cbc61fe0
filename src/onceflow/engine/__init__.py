"""The epoch engine around the coordinator: the slice driver, its read paths and the runner.

`slice_job` is the driver of one slice
(Spark, or `local_slice` in-process), which runs the executor package's tasks and registers their
committables through the coordinator; `read_path` picks a slice's read (`jvm_read`, within the limits of
`jvm_checks`), and `plan_inspection` tells from the transform's plan whether it can be written in one
pass; `submit` builds the spark-submit command line; `runner` chains the steps without Airflow
(``onceflow run``).
"""
