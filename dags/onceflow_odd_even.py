"""The odd/even running sums example (examples/odd_even) as a DAG: keyed state, one epoch per run."""

from onceflow_airflow.dag_factory import build_dag

dag = build_dag("examples.odd_even.pipeline:ODD_EVEN", dag_id="onceflow_odd_even", tags=("example",))
