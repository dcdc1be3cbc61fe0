#!/usr/bin/env bash
# Jars for reading onceflow's Iceberg tables from a local Spark (Spark SQL through Iceberg's JdbcCatalog).
#   infra/iceberg.sh jars    resolve them from Maven Central into $ONCEFLOW_CACHE/iceberg/ (once)
#   infra/iceberg.sh path    print their paths, comma-separated, for spark.jars (resolving first if needed)
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

POM="$ONCEFLOW_ROOT/infra/iceberg/pom.xml"
LIBS="$ONCEFLOW_CACHE/iceberg/libs"

jars() {
  # The marker holds the pom's checksum: a pom that changed resolves again.
  local want
  want=$(sha256sum "$POM" | cut -c1-64)
  if [ -f "$LIBS/.complete" ] && [ "$(cat "$LIBS/.complete")" = "$want" ]; then
    return
  fi
  command -v mvn >/dev/null || onceflow_die "mvn not found: install Maven (apt-get install maven) to resolve the Iceberg jars"
  onceflow_say "resolving the Iceberg Spark runtime and the PostgreSQL and SQLite JDBC drivers from Maven Central into $LIBS"
  rm -rf "$LIBS"; mkdir -p "$LIBS"
  mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$LIBS" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2
  echo "$want" > "$LIBS/.complete"
}

case "${1:-}" in
  jars) jars ;;
  path) jars; ls "$LIBS"/*.jar | paste -sd, - ;;
  *) echo "usage: $0 jars|path" >&2; exit 2 ;;
esac
