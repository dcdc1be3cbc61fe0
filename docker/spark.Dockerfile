# The Spark master/worker image. Executors run Python workers with PYSPARK_PYTHON, which the Airflow
# tasks pass on from their own environment: /opt/onceflow/venv/bin/python, a virtualenv made here with
# onceflow and the pinned dependencies (the same `pip install -c constraints.txt` and extras as
# `make venv`). Runs as uid 50000, group 0, like Airflow: executors write staging to the state volume.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --uid 50000 --gid 0 --create-home --home-dir /home/onceflow onceflow
COPY pyproject.toml constraints.txt README.md /opt/onceflow/
COPY src /opt/onceflow/src
RUN python -m venv /opt/onceflow/venv \
    && /opt/onceflow/venv/bin/pip install --no-cache-dir -c /opt/onceflow/constraints.txt "/opt/onceflow[spark,airflow,dev]" \
    && ln -s "$(/opt/onceflow/venv/bin/python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')" /opt/spark \
    && mkdir -p /opt/onceflow/state && chown -R 50000:0 /opt/onceflow/state
ENV SPARK_HOME=/opt/spark PATH=/opt/onceflow/venv/bin:$PATH PYSPARK_PYTHON=/opt/onceflow/venv/bin/python \
    SPARK_WORKER_DIR=/home/onceflow/spark-work
USER 50000
