#!/usr/bin/env bash
# Start or stop the whole local stack. `start` ends by printing the connection settings as KEY=VALUE
# lines on stdout (progress goes to stderr), so that `eval "$(infra/services.sh start)"` works.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=infra/env.sh
. "$here/env.sh"

print_env() {
  local key
  for key in ONCEFLOW_HOME ONCEFLOW_KAFKA_BOOTSTRAP ONCEFLOW_PG_DSN ONCEFLOW_LEDGER_URL; do
    printf '%s=%q\n' "$key" "${!key}"
  done
}

case "${1:-}" in
  start)
    mkdir -p "$ONCEFLOW_HOME"
    "$here/postgres.sh" start
    "$here/kafka.sh" start
    onceflow_say "local stack is up; stop it with: make services-stop"
    print_env
    ;;
  stop)
    "$here/kafka.sh" stop
    "$here/postgres.sh" stop
    ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
