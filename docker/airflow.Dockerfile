# Airflow 3.3 with onceflow and the pinned dependencies installed (same constraints as `make`).
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow pyproject.toml constraints.txt README.md /opt/onceflow/
COPY --chown=airflow src /opt/onceflow/src
RUN pip install --no-cache-dir -c /opt/onceflow/constraints.txt "/opt/onceflow[spark,airflow]"
