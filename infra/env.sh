# Defaults of the local stack. Sourced by every infra script; each value can be set beforehand in the
# environment, and every onceflow command reads the same ONCEFLOW_* variables.
# shellcheck shell=bash
ONCEFLOW_ROOT="${ONCEFLOW_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
export ONCEFLOW_HOME="${ONCEFLOW_HOME:-$ONCEFLOW_ROOT/.onceflow}"
export ONCEFLOW_CACHE="${ONCEFLOW_CACHE:-$ONCEFLOW_ROOT/.cache}"

export ONCEFLOW_KAFKA_VERSION="${ONCEFLOW_KAFKA_VERSION:-4.1.1}"
export ONCEFLOW_KAFKA_HOST="${ONCEFLOW_KAFKA_HOST:-127.0.0.1}"
export ONCEFLOW_KAFKA_PORT="${ONCEFLOW_KAFKA_PORT:-19092}"
export ONCEFLOW_KAFKA_CONTROLLER_PORT="${ONCEFLOW_KAFKA_CONTROLLER_PORT:-19093}"
export ONCEFLOW_KAFKA_DATA="${ONCEFLOW_KAFKA_DATA:-$ONCEFLOW_HOME/kafka}"
export ONCEFLOW_KAFKA_HEAP="${ONCEFLOW_KAFKA_HEAP:-768m}"
# Brokers of the local cluster: 1 (one combined broker+controller, the default) or 3 to 9 combined
# broker+controller processes; broker n listens on ONCEFLOW_KAFKA_PORT + 2(n-1), its controller on
# ONCEFLOW_KAFKA_CONTROLLER_PORT + 2(n-1).
export ONCEFLOW_KAFKA_BROKERS="${ONCEFLOW_KAFKA_BROKERS:-1}"
# More broker settings, as space-separated key=value pairs for every broker's server.properties (they win
# over infra/kafka.sh's own), e.g. "broker.session.timeout.ms=4000 broker.heartbeat.interval.ms=1000".
export ONCEFLOW_KAFKA_CONF="${ONCEFLOW_KAFKA_CONF:-}"
onceflow_kafka_port() { printf '%s' $(($2 + 2 * ($1 - 1))); }
_onceflow_bootstrap="$ONCEFLOW_KAFKA_HOST:$ONCEFLOW_KAFKA_PORT"
case "$ONCEFLOW_KAFKA_BROKERS" in
  [1-9]) # anything else is refused by infra/kafka.sh, with a clear line
    for ((_onceflow_n = 2; _onceflow_n <= ONCEFLOW_KAFKA_BROKERS; _onceflow_n++)); do
      _onceflow_bootstrap+=",$ONCEFLOW_KAFKA_HOST:$(onceflow_kafka_port "$_onceflow_n" "$ONCEFLOW_KAFKA_PORT")"
    done
    ;;
esac
export ONCEFLOW_KAFKA_BOOTSTRAP="${ONCEFLOW_KAFKA_BOOTSTRAP:-$_onceflow_bootstrap}"
unset _onceflow_bootstrap _onceflow_n

export ONCEFLOW_PG_HOST="${ONCEFLOW_PG_HOST:-127.0.0.1}"
export ONCEFLOW_PG_PORT="${ONCEFLOW_PG_PORT:-15432}"
export ONCEFLOW_PG_DATA="${ONCEFLOW_PG_DATA:-$ONCEFLOW_HOME/postgres}"
export ONCEFLOW_PG_USER="${ONCEFLOW_PG_USER:-onceflow}"
export ONCEFLOW_PG_PASSWORD="${ONCEFLOW_PG_PASSWORD:-onceflow}"
export ONCEFLOW_PG_DATABASE="${ONCEFLOW_PG_DATABASE:-onceflow}"
export ONCEFLOW_PG_MAX_PREPARED="${ONCEFLOW_PG_MAX_PREPARED:-100}"
# Logical decoding (wal_level=logical): replication slots, and as many WAL senders (one per CDC connector).
export ONCEFLOW_PG_MAX_REPLICATION_SLOTS="${ONCEFLOW_PG_MAX_REPLICATION_SLOTS:-20}"
export ONCEFLOW_PG_DSN="${ONCEFLOW_PG_DSN:-postgresql://$ONCEFLOW_PG_USER:$ONCEFLOW_PG_PASSWORD@$ONCEFLOW_PG_HOST:$ONCEFLOW_PG_PORT/$ONCEFLOW_PG_DATABASE}"

# The ledger: an embedded SQLite file unless pointed elsewhere (any SQLAlchemy URL).
export ONCEFLOW_LEDGER_URL="${ONCEFLOW_LEDGER_URL:-sqlite:///$ONCEFLOW_HOME/ledger.db}"

onceflow_say() { printf '[onceflow] %s\n' "$*" >&2; }
onceflow_die() { printf '[onceflow] error: %s\n' "$*" >&2; exit 1; }

# Wait until CHECK (a command) succeeds, the process in PIDFILE is alive, and at most TIMEOUT seconds.
onceflow_wait_for() {
  local what=$1 pidfile=$2 timeout=$3 log=$4; shift 4
  local waited=0
  until "$@" >/dev/null 2>&1; do
    if [ -n "$pidfile" ] && ! kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null; then
      onceflow_say "$what exited while starting; last lines of $log:"
      tail -n 30 "$log" >&2 || true
      return 1
    fi
    if [ "$waited" -ge "$timeout" ]; then
      onceflow_say "$what did not answer within ${timeout}s; last lines of $log:"
      tail -n 30 "$log" >&2 || true
      return 1
    fi
    sleep 1; waited=$((waited + 1))
  done
}

# Stop the process in PIDFILE: SIGTERM, then SIGKILL after TIMEOUT seconds (or at once with SIGNAL=KILL).
onceflow_stop_pid() {
  local what=$1 pidfile=$2 timeout=${3:-30} signal=${4:-TERM}
  local pid
  pid=$(head -n 1 "$pidfile" 2>/dev/null || true)
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    onceflow_say "$what is not running"
    rm -f "$pidfile"
    return 0
  fi
  onceflow_say "stopping $what (pid $pid, SIG$signal)"
  # With SIGKILL the children go too (a killed postmaster leaves its backends holding shared memory).
  local children=""
  [ "$signal" = KILL ] && children=$(pgrep -P "$pid" || true)
  # shellcheck disable=SC2086
  kill "-$signal" "$pid" $children 2>/dev/null || true
  local waited=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge $((timeout * 2)) ]; then
      onceflow_say "$what still running after ${timeout}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.5; waited=$((waited + 1))
  done
  rm -f "$pidfile"
}

onceflow_port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# Where DAGs find the spark-submit entry points (docker-compose mounts them elsewhere).
export ONCEFLOW_SPARK_JOBS="${ONCEFLOW_SPARK_JOBS:-$ONCEFLOW_ROOT/spark_jobs}"

# The pipelines that the CLI and the epochs console act on by name (module:attribute, comma-separated).
export ONCEFLOW_PIPELINES="${ONCEFLOW_PIPELINES:-}"

# `make services` starts the warm runtime unless ONCEFLOW_WARM_SPARK=0.
export ONCEFLOW_WARM_SPARK="${ONCEFLOW_WARM_SPARK:-1}"
# The warm Spark runtime (infra/spark.sh): a standalone master, two workers and a Spark Connect server,
# from the pyspark wheel of this Python, on loopback; pids, logs and scratch space in ONCEFLOW_SPARK_DATA.
export ONCEFLOW_SPARK_PYTHON="${ONCEFLOW_SPARK_PYTHON:-$ONCEFLOW_ROOT/.venv/bin/python}"
export ONCEFLOW_SPARK_HOST="${ONCEFLOW_SPARK_HOST:-127.0.0.1}"
export ONCEFLOW_SPARK_CONNECT_PORT="${ONCEFLOW_SPARK_CONNECT_PORT:-15002}"
export ONCEFLOW_SPARK_MASTER_PORT="${ONCEFLOW_SPARK_MASTER_PORT:-17077}"
# The master's web UI; the workers' are on the next ports (+1, +2).
export ONCEFLOW_SPARK_MASTER_UI_PORT="${ONCEFLOW_SPARK_MASTER_UI_PORT:-18180}"
export ONCEFLOW_SPARK_UI_PORT="${ONCEFLOW_SPARK_UI_PORT:-14040}"
export ONCEFLOW_SPARK_DATA="${ONCEFLOW_SPARK_DATA:-$ONCEFLOW_HOME/spark}"
export ONCEFLOW_SPARK_DAEMON_MEMORY="${ONCEFLOW_SPARK_DAEMON_MEMORY:-256m}"
export ONCEFLOW_SPARK_WORKER_CORES="${ONCEFLOW_SPARK_WORKER_CORES:-1}"
export ONCEFLOW_SPARK_WORKER_MEMORY="${ONCEFLOW_SPARK_WORKER_MEMORY:-1g}"
export ONCEFLOW_SPARK_EXECUTOR_MEMORY="${ONCEFLOW_SPARK_EXECUTOR_MEMORY:-768m}"
export ONCEFLOW_SPARK_DRIVER_MEMORY="${ONCEFLOW_SPARK_DRIVER_MEMORY:-1g}"
# The runtime's shape. ONCEFLOW_SPARK_LEAN=1 (the default, for one machine): one JVM, the Connect server
# running the tasks itself (Spark's local[N,4]: N task threads, each task tried up to 4 times) in
# ONCEFLOW_SPARK_DRIVER_MEMORY. ONCEFLOW_SPARK_LEAN=0: the cluster shape, a standalone master, two workers
# with an executor each and the Connect server (five JVMs), where executors fail apart from the server:
# what the test suite's stacks run (infra/test-stacks.sh), for the tests that kill executors and workers.
export ONCEFLOW_SPARK_LEAN="${ONCEFLOW_SPARK_LEAN:-1}"
export ONCEFLOW_SPARK_LEAN_CORES="${ONCEFLOW_SPARK_LEAN_CORES:-2}"
# How long the Connect server keeps running a query whose client went away (killed) before interrupting it.
export ONCEFLOW_SPARK_DETACHED_TIMEOUT="${ONCEFLOW_SPARK_DETACHED_TIMEOUT:-30s}"
# The address each worker binds to, in order (default: all on ONCEFLOW_SPARK_HOST). Distinct loopback
# addresses ("127.0.0.2 127.0.0.3") make them distinct hosts to Spark's scheduler, as speculation needs:
# it never runs a second attempt of a task on the host of the first.
export ONCEFLOW_SPARK_WORKER_HOSTS="${ONCEFLOW_SPARK_WORKER_HOSTS:-$ONCEFLOW_SPARK_HOST $ONCEFLOW_SPARK_HOST}"
# More settings for the Connect server's application, as space-separated key=value pairs, e.g.
# "spark.speculation=true spark.speculation.multiplier=2"; they win over infra/spark/connect-server.conf.
export ONCEFLOW_SPARK_CONF="${ONCEFLOW_SPARK_CONF:-}"

# The schema registry (infra/registry.sh): Apicurio Registry with in-memory storage, on loopback, its
# Confluent-compatible API on ONCEFLOW_REGISTRY_PORT and Quarkus's management interface (health,
# metrics) on ONCEFLOW_REGISTRY_MANAGEMENT_PORT; it needs Java 21 or newer (ONCEFLOW_REGISTRY_JAVA).
export ONCEFLOW_REGISTRY_VERSION="${ONCEFLOW_REGISTRY_VERSION:-3.3.3}"
export ONCEFLOW_REGISTRY_HOST="${ONCEFLOW_REGISTRY_HOST:-127.0.0.1}"
export ONCEFLOW_REGISTRY_PORT="${ONCEFLOW_REGISTRY_PORT:-18081}"
export ONCEFLOW_REGISTRY_MANAGEMENT_PORT="${ONCEFLOW_REGISTRY_MANAGEMENT_PORT:-18082}"
export ONCEFLOW_REGISTRY_HEAP="${ONCEFLOW_REGISTRY_HEAP:-384m}"
export ONCEFLOW_REGISTRY_DATA="${ONCEFLOW_REGISTRY_DATA:-$ONCEFLOW_HOME/registry}"
# What `make services` prints for onceflow when it runs the registry: the local one's API.
export ONCEFLOW_SCHEMA_REGISTRY_URL="${ONCEFLOW_SCHEMA_REGISTRY_URL:-http://$ONCEFLOW_REGISTRY_HOST:$ONCEFLOW_REGISTRY_PORT/apis/ccompat/v7}"

# `make services` starts Kafka Connect unless ONCEFLOW_KAFKA_CONNECT=0.
export ONCEFLOW_KAFKA_CONNECT="${ONCEFLOW_KAFKA_CONNECT:-1}"
# Kafka Connect for change data capture (infra/connect.sh): one distributed-mode worker on loopback with
# Debezium's PostgreSQL connector and Apicurio Registry's converters on its plugin path; its REST API on
# ONCEFLOW_CONNECT_PORT, its log, pid and properties in ONCEFLOW_CONNECT_DATA.
export ONCEFLOW_CONNECT_HOST="${ONCEFLOW_CONNECT_HOST:-127.0.0.1}"
export ONCEFLOW_CONNECT_PORT="${ONCEFLOW_CONNECT_PORT:-18083}"
export ONCEFLOW_CONNECT_DATA="${ONCEFLOW_CONNECT_DATA:-$ONCEFLOW_HOME/connect}"
export ONCEFLOW_CONNECT_HEAP="${ONCEFLOW_CONNECT_HEAP:-512m}"
export ONCEFLOW_DEBEZIUM_VERSION="${ONCEFLOW_DEBEZIUM_VERSION:-3.6.1.Final}"
export ONCEFLOW_CONNECT_APICURIO_VERSION="${ONCEFLOW_CONNECT_APICURIO_VERSION:-2.6.13.Final}"
# More worker settings, as space-separated key=value pairs (they win over infra/connect.sh's own).
export ONCEFLOW_CONNECT_CONF="${ONCEFLOW_CONNECT_CONF:-}"
export ONCEFLOW_CONNECT_URL="${ONCEFLOW_CONNECT_URL:-http://$ONCEFLOW_CONNECT_HOST:$ONCEFLOW_CONNECT_PORT}"

# `make services` starts the local S3 gateway unless ONCEFLOW_S3=0.
export ONCEFLOW_S3="${ONCEFLOW_S3:-1}"
# Local S3-compatible object storage (infra/s3.sh): Versity's S3 gateway over a folder, on loopback; its
# objects, pid, log and generated credentials in ONCEFLOW_S3_DATA. `make services` prints the settings
# clients take (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, ONCEFLOW_S3_BUCKET).
export ONCEFLOW_S3_VERSION="${ONCEFLOW_S3_VERSION:-v1.8.0}"
export ONCEFLOW_S3_HOST="${ONCEFLOW_S3_HOST:-127.0.0.1}"
export ONCEFLOW_S3_PORT="${ONCEFLOW_S3_PORT:-19000}"
export ONCEFLOW_S3_DATA="${ONCEFLOW_S3_DATA:-$ONCEFLOW_HOME/s3}"
export ONCEFLOW_S3_BUCKET="${ONCEFLOW_S3_BUCKET:-onceflow}"
export ONCEFLOW_S3_REGION="${ONCEFLOW_S3_REGION:-us-east-1}"
