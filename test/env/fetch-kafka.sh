#!/usr/bin/env bash
# Resolves Kafka's classpath from Maven Central into the cache. Idempotent.
# Prints the directory of jars.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

libs="$FLASHSALE_CACHE/kafka-$KAFKA_VERSION/libs"
fetch() {
  if [ -f "$libs/.complete" ]; then return 0; fi
  command -v mvn >/dev/null || { log "installing maven"; apt-get install -y -qq maven >/dev/null; }
  log "resolving Kafka $KAFKA_VERSION jars from Maven Central"
  rm -rf "$libs"; mkdir -p "$libs"
  mvn -B -q -f "$here/kafka/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
    -Dmaven.repo.local="$FLASHSALE_CACHE/m2" \
    org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$libs" >&2
  touch "$libs/.complete"
}
with_lock kafka fetch
echo "$libs"
