# Airflow 3.3 with onceflow and the pinned dependencies: the same `pip install -c constraints.txt` and
# extras as `make venv`. Runs as the image's airflow user (uid 50000, group 0), the uid of every
# container that writes the shared state volume.
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
# Mount points owned by uid 50000: a new named volume starts with its mount point's owner.
RUN mkdir -p /opt/onceflow/state /opt/airflow/auth && chown -R 50000:0 /opt/onceflow /opt/airflow/auth
USER 50000
COPY --chown=50000:0 pyproject.toml constraints.txt README.md /opt/onceflow/
COPY --chown=50000:0 src /opt/onceflow/src
RUN pip install --no-cache-dir -c /opt/onceflow/constraints.txt "/opt/onceflow[spark,airflow,dev]"
