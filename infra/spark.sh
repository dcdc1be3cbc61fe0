#!/usr/bin/env bash
# Local Spark runtime for onceflow, from the pyspark wheel in the virtualenv: a standalone master, two
# workers (separate processes, loopback) and a Spark Connect server running as an application on them,
# with Spark's Kafka source and Avro functions (spark-avro) on its classpath. Slices sent to it skip the
# JVM start-up of a spark-submit. With ONCEFLOW_SPARK_LEAN=1 the Connect server alone, running the tasks
# in its own JVM (local mode): one JVM in place of five.
#   infra/spark.sh jars      resolve the Kafka source and spark-avro for this pyspark version into $ONCEFLOW_CACHE
#   infra/spark.sh start     start what is not running, wait until the Connect server accepts a session,
#                            then print ONCEFLOW_SPARK_REMOTE=sc://... on stdout (progress on stderr)
#   infra/spark.sh env       print ONCEFLOW_SPARK_REMOTE=sc://... (for eval)
# The Connect server answers only clients that present its token (a random one in
# $ONCEFLOW_SPARK_DATA/connect.token, mode 600, made at the first start), which the printed remote
# carries (sc://localhost:PORT/;token=...): the pyspark client sends a token without TLS only to
# "localhost", so the remote names it so; ONCEFLOW_SPARK_HOST must be loopback (any other address is
# refused: Spark Connect serves no TLS, and the server never runs without its token).
#   infra/spark.sh stop      stop by pid (SIGTERM, then SIGKILL); `stop --kill` sends SIGKILL at once
#   infra/spark.sh status    exit 0 when every process runs and the Connect server answers
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

RUN="$ONCEFLOW_SPARK_DATA"
TOKEN_FILE="$RUN/connect.token"
case "$ONCEFLOW_SPARK_HOST" in
  127.*|localhost|::1) SHOWN="sc://localhost:$ONCEFLOW_SPARK_CONNECT_PORT" ;;
  *) onceflow_die "ONCEFLOW_SPARK_HOST=$ONCEFLOW_SPARK_HOST is not loopback: the pyspark client sends the Connect server's token without TLS to localhost only, and the server must never run without one" ;;
esac
# The remote with its token: printed for eval only, never in a message or a log.
remote() {
  if [ -s "$TOKEN_FILE" ]; then
    printf '%s/;token=%s' "$SHOWN" "$(cat "$TOKEN_FILE")"
  else
    printf '%s' "$SHOWN"
  fi
}
make_token() {
  [ -s "$TOKEN_FILE" ] && return
  (umask 077 && "$ONCEFLOW_SPARK_PYTHON" -c 'import secrets; print(secrets.token_hex(32))' > "$TOKEN_FILE")
}
MASTER_URL="spark://$ONCEFLOW_SPARK_HOST:$ONCEFLOW_SPARK_MASTER_PORT"
read -r -a WORKER_HOSTS <<< "$ONCEFLOW_SPARK_WORKER_HOSTS"
[ "${#WORKER_HOSTS[@]}" -eq 2 ] || onceflow_die \
  "ONCEFLOW_SPARK_WORKER_HOSTS must name one address per worker (2), not '$ONCEFLOW_SPARK_WORKER_HOSTS'"
WORKERS=(1 2)
case "$ONCEFLOW_SPARK_LEAN" in
  0) SPARK_MASTER_ARG="$MASTER_URL" ;;
  1) SPARK_MASTER_ARG="local[$ONCEFLOW_SPARK_LEAN_CORES,4]" ;;
  *) onceflow_die "ONCEFLOW_SPARK_LEAN must be 0 or 1, not '$ONCEFLOW_SPARK_LEAN'" ;;
esac

[ -x "$ONCEFLOW_SPARK_PYTHON" ] || onceflow_die \
  "$ONCEFLOW_SPARK_PYTHON not found: run \`make venv\` first, or set ONCEFLOW_SPARK_PYTHON to a Python with pyspark"
read -r SPARK_VERSION SPARK_HOME < <("$ONCEFLOW_SPARK_PYTHON" -c \
  'import os, pyspark; print(pyspark.__version__, os.path.dirname(pyspark.__file__))') \
  || onceflow_die "pyspark is not installed in $ONCEFLOW_SPARK_PYTHON: run \`make venv\`"
export SPARK_HOME
LIBS="$ONCEFLOW_CACHE/spark-jars-$SPARK_VERSION/jars"

# Every Spark process: loopback only, its configuration, scratch space and logs under $RUN.
export SPARK_LOCAL_IP="$ONCEFLOW_SPARK_HOST"
export SPARK_CONF_DIR="$RUN/conf"
export SPARK_LOCAL_DIRS="$RUN/local"
# Executors run the venv's Python, so onceflow imports on them; pipelines' own modules come per session.
export PYSPARK_PYTHON="$ONCEFLOW_SPARK_PYTHON"

jars() {
  # The marker holds the pom's checksum: a pom that changed (a jar added) resolves again.
  local want
  want=$(sha256sum "$ONCEFLOW_ROOT/infra/spark/pom.xml" | cut -c1-64)
  if [ -f "$LIBS/.complete" ] && [ "$(cat "$LIBS/.complete")" = "$want" ]; then
    onceflow_say "Spark Kafka source, spark-avro and delta-spark for Spark $SPARK_VERSION already in $LIBS"
    return
  fi
  command -v mvn >/dev/null || onceflow_die "mvn not found: install Maven (apt-get install maven) to resolve the Spark Kafka source and spark-avro"
  onceflow_say "resolving the Spark Kafka source, spark-avro and delta-spark (spark-sql-kafka-0-10_2.13 $SPARK_VERSION, spark-avro_2.13 of its minor line, delta-spark_2.13 for it) from Maven Central into $LIBS"
  local resolved="$LIBS.resolving"
  rm -rf "$LIBS" "$resolved"; mkdir -p "$LIBS" "$resolved"
  mvn -q -B -Dstyle.color=never -f "$ONCEFLOW_ROOT/infra/spark/pom.xml" dependency:copy-dependencies \
    -Dspark.version="$SPARK_VERSION" -Dspark.minor="${SPARK_VERSION%.*}" -DincludeScope=runtime \
    -DoutputDirectory="$resolved" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2
  # Keep only what the wheel does not ship: two versions of one library on a classpath is a conflict.
  local jar name base
  for jar in "$resolved"/*.jar; do
    name=$(basename "$jar" .jar); base=${name%-[0-9]*}
    if compgen -G "$SPARK_HOME/jars/$base-[0-9]*.jar" >/dev/null; then continue; fi
    mv "$jar" "$LIBS/"
  done
  rm -rf "$resolved"
  [ -n "$(compgen -G "$LIBS/spark-sql-kafka-0-10_*.jar")" ] || onceflow_die "the Spark Kafka source was not resolved into $LIBS"
  [ -n "$(compgen -G "$LIBS/spark-avro_*.jar")" ] || onceflow_die "spark-avro was not resolved into $LIBS"
  [ -n "$(compgen -G "$LIBS/delta-spark_*.jar")" ] || onceflow_die "delta-spark was not resolved into $LIBS"
  echo "$want" > "$LIBS/.complete"
}

write_config() {
  mkdir -p "$SPARK_CONF_DIR" "$SPARK_LOCAL_DIRS"
  # Spark's log4j2 default logs INFO to stderr (the log files below); keep the noisy parts at WARN.
  cat > "$SPARK_CONF_DIR/log4j2.properties" <<CONF
# Written by infra/spark.sh.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
logger.connect.name = org.apache.spark.sql.connect.service
logger.connect.level = info
CONF
}

pidfile() { printf '%s/%s.pid' "$RUN" "$1"; }
logfile() { printf '%s/%s.log' "$RUN" "$1"; }
alive() { kill -0 "$(cat "$(pidfile "$1")" 2>/dev/null)" 2>/dev/null; }

# Start NAME (a pid and a log under $RUN) running COMMAND..., unless it runs already.
launch() {
  local name=$1; shift
  if alive "$name"; then
    onceflow_say "Spark $name already running (pid $(cat "$(pidfile "$name")"))"
    return
  fi
  : > "$(logfile "$name")"
  # spark-class and spark-submit exec the JVM, so the pid written is the JVM's.
  (cd "$RUN" && exec nohup "$@" >>"$(logfile "$name")" 2>&1 < /dev/null) &
  echo $! > "$(pidfile "$name")"
}

master_answers() { onceflow_port_open "$ONCEFLOW_SPARK_HOST" "$ONCEFLOW_SPARK_MASTER_PORT"; }
worker_registered() { grep -q "Successfully registered with master" "$(logfile "worker-$1")" 2>/dev/null; }

# A session really answers: it is created and runs a job on the cluster's executors.
session_answers() {
  onceflow_port_open "$ONCEFLOW_SPARK_HOST" "$ONCEFLOW_SPARK_CONNECT_PORT" || return 1
  ONCEFLOW_CHECK_REMOTE="$(remote)" timeout 60 "$ONCEFLOW_SPARK_PYTHON" - <<'PY'
import os
from pyspark.sql import SparkSession

session = SparkSession.builder.remote(os.environ["ONCEFLOW_CHECK_REMOTE"]).create()
try:
    assert session.range(0, 4, 1, 2).count() == 4
finally:
    session.stop()
PY
}

start_master() {
  if ! alive master && port_stays_taken "$ONCEFLOW_SPARK_MASTER_PORT"; then
    onceflow_die "port $ONCEFLOW_SPARK_MASTER_PORT is taken by another process; set ONCEFLOW_SPARK_MASTER_PORT"
  fi
  alive master || onceflow_say "starting the Spark $SPARK_VERSION master on $MASTER_URL (UI on http://$ONCEFLOW_SPARK_HOST:$ONCEFLOW_SPARK_MASTER_UI_PORT)"
  SPARK_DAEMON_MEMORY="$ONCEFLOW_SPARK_DAEMON_MEMORY" launch master "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host "$ONCEFLOW_SPARK_HOST" --port "$ONCEFLOW_SPARK_MASTER_PORT" --webui-port "$ONCEFLOW_SPARK_MASTER_UI_PORT"
  onceflow_wait_for "Spark master" "$(pidfile master)" 120 "$(logfile master)" master_answers
}

start_worker() {
  local n=$1 host=${WORKER_HOSTS[$(($1 - 1))]}
  alive "worker-$n" || onceflow_say "starting Spark worker $n on $host ($ONCEFLOW_SPARK_WORKER_CORES cores, $ONCEFLOW_SPARK_WORKER_MEMORY)"
  mkdir -p "$RUN/work-$n"
  # The worker and the executors it starts bind to its own address.
  SPARK_LOCAL_IP="$host" SPARK_DAEMON_MEMORY="$ONCEFLOW_SPARK_DAEMON_MEMORY" \
    SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.appDataTtl=86400" \
    launch "worker-$n" "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
    --host "$host" --cores "$ONCEFLOW_SPARK_WORKER_CORES" --memory "$ONCEFLOW_SPARK_WORKER_MEMORY" \
    --webui-port $((ONCEFLOW_SPARK_MASTER_UI_PORT + n)) --work-dir "$RUN/work-$n" "$MASTER_URL"
}

# Whether a port stays taken for 30 s: a server killed a moment ago may still be releasing it.
port_stays_taken() {
  local waited=0
  while onceflow_port_open "$ONCEFLOW_SPARK_HOST" "$1"; do
    [ "$waited" -ge 30 ] && return 0
    sleep 1; waited=$((waited + 1))
  done
  return 1
}

start_connect() {
  if ! alive connect && port_stays_taken "$ONCEFLOW_SPARK_CONNECT_PORT"; then
    onceflow_die "port $ONCEFLOW_SPARK_CONNECT_PORT is taken by another process; set ONCEFLOW_SPARK_CONNECT_PORT"
  fi
  alive connect || onceflow_say "starting the Spark Connect server on $SHOWN (UI on http://$ONCEFLOW_SPARK_HOST:$ONCEFLOW_SPARK_UI_PORT)"
  # In the server's environment (not its command line, which `ps` shows); unset again below.
  SPARK_CONNECT_AUTHENTICATE_TOKEN="$(cat "$TOKEN_FILE")"
  export SPARK_CONNECT_AUTHENTICATE_TOKEN
  local jar_list setting extra=()
  # Lean: the serial collector, the JVM's own choice on a small machine. G1 committed the whole heap
  # during a 10^6-record epoch and kept it (1.27 GB of PSS at a 768 MB heap); the serial one took 0.8 GB.
  # The serial collector keeps what it committed unless a full collection finds more than
  # MaxHeapFreeRatio of the heap free (70% by default): at 40% the heap gives back what a busy hour grew.
  local lean_gc="-XX:+UseSerialGC -XX:MinHeapFreeRatio=20 -XX:MaxHeapFreeRatio=40"
  [ "$ONCEFLOW_SPARK_LEAN" = 1 ] && extra+=(--conf "spark.driver.extraJavaOptions=$lean_gc")
  jar_list=$(compgen -G "$LIBS/*.jar" | paste -sd, -)
  for setting in $ONCEFLOW_SPARK_CONF; do
    [[ $setting == spark.*=* ]] || onceflow_die "ONCEFLOW_SPARK_CONF: '$setting' is not a spark.key=value pair"
    extra+=(--conf "$setting")
  done
  # Slices set their own SQL settings per session; the cluster-wide ones are in infra/spark/connect-server.conf
  # (docker-compose.yml runs its server with the same file). spark-submit sizes this server's heap from
  # SPARK_DAEMON_MEMORY, as for the other daemons; a caller's SPARK_SUBMIT_OPTS, meant for its own
  # spark-submits, does not reach this long-lived server.
  SPARK_SUBMIT_OPTS="" SPARK_DAEMON_MEMORY="$ONCEFLOW_SPARK_DRIVER_MEMORY" launch connect "$SPARK_HOME/bin/spark-submit" \
    --class org.apache.spark.sql.connect.service.SparkConnectServer --name "onceflow Spark Connect server" \
    --properties-file "$ONCEFLOW_ROOT/infra/spark/connect-server.conf" \
    --master "$SPARK_MASTER_ARG" --driver-memory "$ONCEFLOW_SPARK_DRIVER_MEMORY" --jars "$jar_list" \
    --conf "spark.executor.memory=$ONCEFLOW_SPARK_EXECUTOR_MEMORY" \
    --conf "spark.executor.cores=$ONCEFLOW_SPARK_WORKER_CORES" \
    --conf "spark.pyspark.python=$ONCEFLOW_SPARK_PYTHON" \
    --conf "spark.connect.grpc.binding.address=$ONCEFLOW_SPARK_HOST" \
    --conf "spark.connect.grpc.binding.port=$ONCEFLOW_SPARK_CONNECT_PORT" \
    --conf "spark.ui.port=$ONCEFLOW_SPARK_UI_PORT" \
    --conf "spark.connect.execute.manager.detachedTimeout=$ONCEFLOW_SPARK_DETACHED_TIMEOUT" \
    ${extra[@]+"${extra[@]}"}
  unset SPARK_CONNECT_AUTHENTICATE_TOKEN
  printf '%s\n' "$SPARK_MASTER_ARG" > "$RUN/connect.master"
}

remote_line() { printf 'ONCEFLOW_SPARK_REMOTE=%q\n' "$(remote)"; }

start() {
  jars
  mkdir -p "$RUN"
  make_token
  write_config
  if [ "$ONCEFLOW_SPARK_LEAN" = 1 ]; then
    same_master
    start_connect
    onceflow_wait_for "Spark Connect server" "$(pidfile connect)" 180 "$(logfile connect)" session_answers
    onceflow_say "Spark is up (lean): Spark Connect on $SHOWN running its tasks itself ($SPARK_MASTER_ARG); logs in $RUN"
    remote_line
    return
  fi
  same_master
  start_master
  local n
  for n in "${WORKERS[@]}"; do start_worker "$n"; done
  for n in "${WORKERS[@]}"; do
    onceflow_wait_for "Spark worker $n" "$(pidfile "worker-$n")" 120 "$(logfile "worker-$n")" worker_registered "$n"
  done
  start_connect
  onceflow_wait_for "Spark Connect server" "$(pidfile connect)" 180 "$(logfile connect)" session_answers
  onceflow_say "Spark is up: master $MASTER_URL, ${#WORKERS[@]} workers, Spark Connect on $SHOWN; logs in $RUN"
  remote_line
}

stop() {
  local signal=TERM
  [ "${1:-}" = "--kill" ] && signal=KILL
  onceflow_stop_pid "Spark Connect server" "$(pidfile connect)" 60 "$signal"
  local n
  for n in "${WORKERS[@]}"; do onceflow_stop_pid "Spark worker $n" "$(pidfile "worker-$n")" 30 "$signal"; done
  onceflow_stop_pid "Spark master" "$(pidfile master)" 30 "$signal"
}

# A running Connect server keeps its master: a start with ONCEFLOW_SPARK_LEAN changed stops, it does not mix.
same_master() {
  local running
  alive connect || return 0
  running=$(cat "$RUN/connect.master" 2>/dev/null || echo "$MASTER_URL")
  [ "$running" = "$SPARK_MASTER_ARG" ] || onceflow_die \
    "the running Spark Connect server runs its tasks on $running, not $SPARK_MASTER_ARG (ONCEFLOW_SPARK_LEAN=$ONCEFLOW_SPARK_LEAN): stop it first (make services-stop)"
}

status() {
  local name names=(master worker-1 worker-2 connect)
  [ "$ONCEFLOW_SPARK_LEAN" = 1 ] && names=(connect)
  for name in "${names[@]}"; do alive "$name" || return 1; done
  session_answers >/dev/null 2>&1
}

case "${1:-}" in
  jars) jars ;;
  start) start ;;
  stop) shift; stop "$@" ;;
  restart) stop; start ;;
  status) status ;;
  env) remote_line ;;
  *) echo "usage: $0 jars|start|stop [--kill]|restart|status|env" >&2; exit 2 ;;
esac
