#!/usr/bin/env bash
# Starts a three-broker Kafka cluster (KRaft, each node a broker and a controller voter) on free
# loopback ports, beside the single broker of start-kafka.sh: topics with replication factor 3 and
# min.insync.replicas=2 survive one SIGKILLed broker.
# Usage: start-kafka-cluster.sh STATE_DIR   (KAFKA_CLUSTER_SIZE nodes, default 3)
# Writes STATE_DIR/kafka-cluster.env (KAFKA_CLUSTER_BROKERS, KAFKA_CLUSTER_CONFIGS,
# KAFKA_CLUSTER_NODE_DIRS, KAFKA_LIBS) and kafka-cluster-<i>.pid per node, so env-down.sh stops them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
KAFKA_BROKERS_COUNT="${KAFKA_CLUSTER_SIZE:-3}" KAFKA_STATE_NAME=kafka-cluster exec bash "$here/start-kafka.sh" "$1"
