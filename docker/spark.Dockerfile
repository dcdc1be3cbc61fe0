# A Spark master/worker image whose Python has onceflow (executors import its readers and sink writers).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml constraints.txt README.md /opt/onceflow/
COPY src /opt/onceflow/src
RUN pip install --no-cache-dir -c /opt/onceflow/constraints.txt "/opt/onceflow[spark]" \
    && ln -s "$(python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')" /opt/spark
ENV SPARK_HOME=/opt/spark PYSPARK_PYTHON=python3
