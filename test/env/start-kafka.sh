#!/usr/bin/env bash
# Starts a single-node Kafka (KRaft, combined broker+controller) on free loopback ports.
# Usage: start-kafka.sh STATE_DIR   (writes STATE_DIR/kafka.env and kafka.pid)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"

libs="$(bash "$here/fetch-kafka.sh")"
data="$state/kafka"
mkdir -p "$data/logs"
port="$(free_port)"
cport="$(free_port)"
while [ "$cport" = "$port" ]; do cport="$(free_port)"; done
cat >"$data/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$data/logs
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.flush.interval.messages=1
CONF
cat >"$data/log4j.properties" <<CONF
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$state/kafka.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
CONF
jvm=(java -Xms256m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto
  "-Dlog4j.configuration=file:$data/log4j.properties" -cp "$libs/*")
# A cluster id as StorageTool random-uuid makes it (base64url of 16 random bytes, not starting with
# '-'), without paying for one more JVM start.
uuid="-"
while [ "${uuid:0:1}" = "-" ]; do uuid="$(openssl rand 16 | base64 | tr '+/' '-_' | tr -d '=')"; done
"${jvm[@]}" kafka.tools.StorageTool format -t "$uuid" -c "$data/server.properties" >"$state/kafka-format.log" 2>&1
nohup "${jvm[@]}" kafka.Kafka "$data/server.properties" >"$state/kafka.out" 2>&1 &
echo $! >"$state/kafka.pid"
# The port opens before the broker has registered; a metadata round trip proves it serves.
wait_up "kafka port" 90 "$(cat "$state/kafka.pid")" "$state/kafka.out" bash -c "exec 3<>/dev/tcp/127.0.0.1/$port"
wait_up "kafka metadata" 60 "$(cat "$state/kafka.pid")" "$state/kafka.log" node "$here/kafka-ready.cjs" "127.0.0.1:$port"
cat >"$state/kafka.env" <<ENV
KAFKA_BROKERS=127.0.0.1:$port
KAFKA_LIBS=$libs
KAFKA_CONFIG=$data/server.properties
ENV
log "kafka ready on 127.0.0.1:$port"
