"""The epochs console's library half: what an operator sees of a pipeline, and the actions it may take.

`read_model` turns the ledger (and Kafka's end offsets) into plain JSON-ready dicts: epochs with their
ranges and participants, what is in doubt now and for how long, dead letters, lag. `actions` runs commit,
abort and recover through the same `Coordinator` as the CLI and the DAG tasks, so a refusal reads the same
at every door. Nothing here imports Airflow: the Airflow plugin (``plugins/onceflow_airflow``) serves these
behind Airflow's login and permissions, and the CLI prints some of the same dicts.
"""
