-- Databases beside the default one: the Airflow metadata DB and the onceflow ledger.
CREATE DATABASE airflow;
CREATE DATABASE onceflow_ledger;
