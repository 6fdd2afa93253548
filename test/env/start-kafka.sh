#!/usr/bin/env bash
# Starts Kafka (KRaft) on free loopback ports: one combined broker+controller node by default, or
# KAFKA_BROKERS_COUNT nodes forming one cluster (each a broker and a controller voter, so a quorum
# survives one SIGKILLed node of three).
# Usage: start-kafka.sh STATE_DIR
#   One node:  writes STATE_DIR/kafka.env (KAFKA_BROKERS, KAFKA_LIBS, KAFKA_CONFIG) and kafka.pid.
#   N nodes:   writes STATE_DIR/<name>.env (<VAR>_BROKERS as a comma-separated list, KAFKA_LIBS,
#              <VAR>_CONFIGS, <VAR>_NODE_DIRS) and <name>-<i>.pid per node; <name> is kafka unless
#              KAFKA_STATE_NAME says otherwise (start-kafka-cluster.sh uses kafka-cluster, whose
#              variables are KAFKA_CLUSTER_*). Each node dir holds run.sh, the command that (re)starts
#              it on the same port and data (the fault harness restarts a killed broker with it).
# A cluster's internal topics and its default for new topics use replication min(3, N) and
# min.insync.replicas min(2, N), as docs/install.md recommends for production.
# KAFKA_EXTRA_PROPERTIES (lines) is appended to every node's server.properties (an authorizer).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"
count="${KAFKA_BROKERS_COUNT:-1}"
name="${KAFKA_STATE_NAME:-kafka}"
[[ "$count" =~ ^[1-9]$ ]] || die "KAFKA_BROKERS_COUNT must be 1 to 9, got '$count'"
var="$(printf '%s' "$name" | tr 'a-z-' 'A-Z_')"

libs="$(bash "$here/fetch-kafka.sh")"
# Ports: a broker and a controller port per node, all distinct.
ports=()
while [ ${#ports[@]} -lt $((2 * count)) ]; do
  p="$(free_port)"
  case " ${ports[*]} " in *" $p "*) ;; *) ports+=("$p") ;; esac
done
rf=$((count < 3 ? count : 3))
isr=$((count < 2 ? count : 2))
voters=""
for i in $(seq 1 "$count"); do voters+="${voters:+,}$i@127.0.0.1:${ports[$((2 * i - 1))]}"; done

# A cluster id as StorageTool random-uuid makes it (base64url of 16 random bytes, not starting with
# '-'), without paying for one more JVM start.
uuid="-"
while [ "${uuid:0:1}" = "-" ]; do uuid="$(openssl rand 16 | base64 | tr '+/' '-_' | tr -d '=')"; done

# node_dir I: one node's data dir (the single node keeps the historical layout STATE/kafka).
node_dir() { if [ "$count" -eq 1 ]; then echo "$state/$name"; else echo "$state/$name/$1"; fi; }
# node_file I SUFFIX: one node's pid/log file name in STATE.
node_file() { if [ "$count" -eq 1 ]; then echo "$state/$name$2"; else echo "$state/$name-$1$2"; fi; }

brokers=""
configs=""
dirs=""
for i in $(seq 1 "$count"); do
  data="$(node_dir "$i")"
  port="${ports[$((2 * i - 2))]}"
  mkdir -p "$data/logs"
  cat >"$data/server.properties" <<CONF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:${ports[$((2 * i - 1))]}
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$data/logs
num.partitions=4
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.flush.interval.messages=1
CONF
  if [ -n "${KAFKA_EXTRA_PROPERTIES:-}" ]; then
    printf '%s\n' "$KAFKA_EXTRA_PROPERTIES" >>"$data/server.properties"
  fi
  cat >"$data/log4j.properties" <<CONF
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$(node_file "$i" .log)
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
CONF
  # Heap at most 512 MiB per node (three nodes share a small machine with other test servers).
  cat >"$data/run.sh" <<RUN
#!/usr/bin/env bash
# (Re)starts Kafka node $i of $state on its port and data (written by start-kafka.sh).
exec java -Xms${KAFKA_HEAP_MIN:-$([ "$count" -eq 1 ] && echo 256m || echo 128m)} -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \\
  "-Dlog4j.configuration=file:$data/log4j.properties" -cp "$libs/*" "\$@"
RUN
  # Formatting is one JVM start per node: in parallel.
  bash "$data/run.sh" kafka.tools.StorageTool format -t "$uuid" -c "$data/server.properties" \
    >"$(node_file "$i" -format.log)" 2>&1 &
  brokers+="${brokers:+,}127.0.0.1:$port"
  configs+="${configs:+,}$data/server.properties"
  dirs+="${dirs:+,}$data"
done
wait
# Every voter must run before the quorum elects a leader: start them all, then wait for each.
for i in $(seq 1 "$count"); do
  nohup bash "$(node_dir "$i")/run.sh" kafka.Kafka "$(node_dir "$i")/server.properties" \
    >"$(node_file "$i" .out)" 2>&1 &
  echo $! >"$(node_file "$i" .pid)"
done
for i in $(seq 1 "$count"); do
  port="${ports[$((2 * i - 2))]}"
  pid="$(cat "$(node_file "$i" .pid)")"
  # The port opens before the broker has registered; a metadata round trip proves it serves.
  wait_up "kafka node $i port" 120 "$pid" "$(node_file "$i" .out)" bash -c "exec 3<>/dev/tcp/127.0.0.1/$port"
  wait_up "kafka node $i metadata" 90 "$pid" "$(node_file "$i" .log)" node "$here/kafka-ready.cjs" "127.0.0.1:$port" "$count"
done
if [ "$count" -eq 1 ]; then
  cat >"$state/$name.env" <<ENV
${var}_BROKERS=$brokers
KAFKA_LIBS=$libs
${var}_CONFIG=$configs
ENV
else
  cat >"$state/$name.env" <<ENV
${var}_BROKERS=$brokers
KAFKA_LIBS=$libs
${var}_CONFIGS=$configs
${var}_NODE_DIRS=$dirs
ENV
fi
log "kafka ready on $brokers ($count node(s))"
