"""Tools of the local stack (not the library): the demo and Airflow commands against the local services."""
