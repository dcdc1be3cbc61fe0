#!/usr/bin/env bash
# The suite's stacks: `make test` runs its integration and fault tests in N lanes (ONCEFLOW_TEST_LANES,
# default 2), each lane against a whole local stack of its own, so that a lane killing its Kafka broker,
# PostgreSQL or Spark runtime never disturbs a test of the other lane. Stack 1 is the usual one
# (.onceflow/, the default ports). Stack n > 1 lives in .onceflow/stack-n/ with every port moved up by
# 1000 * (n - 1), so that the ports a fault test derives from its stack's (a private three-broker
# cluster at the broker port + 100) stay apart too.
#
#   infra/test-stacks.sh start N   start stacks 1..N one after the other (they share the jar caches) and
#                                  write each one's settings to .onceflow/test-stack-n.env (KEY=VALUE)
#   infra/test-stacks.sh stop      stop the stacks n > 1 that a run left (stack 1: infra/services.sh stop)
#   infra/test-stacks.sh settings N   print stack N's home, shape and ports (KEY=VALUE), starting nothing
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
home="${ONCEFLOW_HOME:-$(dirname "$here")/.onceflow}"
say() { printf '[onceflow] %s\n' "$*" >&2; }

# The ports of a stack and their defaults, as infra/env.sh has them.
PORTS=(
  ONCEFLOW_KAFKA_PORT=19092 ONCEFLOW_KAFKA_CONTROLLER_PORT=19093 ONCEFLOW_PG_PORT=15432
  ONCEFLOW_SPARK_CONNECT_PORT=15002 ONCEFLOW_SPARK_MASTER_PORT=17077 ONCEFLOW_SPARK_MASTER_UI_PORT=18180
  ONCEFLOW_SPARK_UI_PORT=14040 ONCEFLOW_REGISTRY_PORT=18081 ONCEFLOW_REGISTRY_MANAGEMENT_PORT=18082
  ONCEFLOW_CONNECT_PORT=18083 ONCEFLOW_S3_PORT=19000
)
# Settings that infra/env.sh derives from the home and the ports: a stack n > 1 derives its own.
DERIVED=(
  ONCEFLOW_KAFKA_DATA ONCEFLOW_KAFKA_BOOTSTRAP ONCEFLOW_PG_DATA ONCEFLOW_PG_DSN ONCEFLOW_LEDGER_URL
  ONCEFLOW_SPARK_DATA ONCEFLOW_SPARK_REMOTE ONCEFLOW_REGISTRY_DATA ONCEFLOW_SCHEMA_REGISTRY_URL
  ONCEFLOW_CONNECT_DATA ONCEFLOW_CONNECT_URL ONCEFLOW_S3_DATA AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID
  AWS_SECRET_ACCESS_KEY
)

# Stack n's home and ports, as KEY=VALUE lines.
stack_settings() {
  local n=$1 pair key base
  if [ "$n" = 1 ]; then printf 'ONCEFLOW_HOME=%s\n' "$home"; else printf 'ONCEFLOW_HOME=%s\n' "$home/stack-$n"; fi
  # The cluster-shaped Spark runtime: the suite's fault tests kill executors and workers apart from the
  # Connect server (ONCEFLOW_TEST_SPARK_LEAN=1 runs the suite on the lean one instead).
  printf 'ONCEFLOW_SPARK_LEAN=%s\n' "${ONCEFLOW_TEST_SPARK_LEAN:-0}"
  for pair in "${PORTS[@]}"; do
    key=${pair%%=*}
    base=${!key:-${pair#*=}}
    printf '%s=%s\n' "$key" $((base + 1000 * (n - 1)))
  done
}

# Run infra/services.sh ARGS as stack n.
as_stack() {
  local n=$1; shift
  local unset=()
  if [ "$n" != 1 ]; then for key in "${DERIVED[@]}"; do unset+=(-u "$key"); done; fi
  # shellcheck disable=SC2046
  env "${unset[@]}" $(stack_settings "$n") "$here/services.sh" "$@"
}

case "${1:-}" in
  start)
    lanes=${2:-2}
    case "$lanes" in [1-4]) ;; *) say "error: test-stacks.sh start N: N is 1 to 4, not '$lanes'"; exit 1 ;; esac
    case "$home" in *" "*) say "error: ONCEFLOW_HOME has a space ('$home'): the test stacks need one without"; exit 1 ;; esac
    mkdir -p "$home"
    for ((n = 1; n <= lanes; n++)); do
      say "test stack $n of $lanes: $(stack_settings "$n" | head -n 1)"
      printed=$(as_stack "$n" start)
      # Its home and ports first, then what services.sh prints for clients (the DSN, the remote, ...).
      printf '%s\n%s\n' "$(stack_settings "$n")" "$printed" > "$home/test-stack-$n.env"
    done
    ;;
  stop)
    for dir in "$home"/stack-*; do
      [ -d "$dir" ] || continue
      say "stopping test stack ${dir##*-} ($dir)"
      as_stack "${dir##*-}" stop
    done
    ;;
  settings) stack_settings "${2:-1}" ;;
  *) echo "usage: $0 start N|stop|settings N" >&2; exit 2 ;;
esac
