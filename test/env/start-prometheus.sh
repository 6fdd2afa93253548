#!/usr/bin/env bash
# Starts Prometheus (Debian's `prometheus` package, installed by deps.sh) on a free loopback port,
# scraping every second the targets listed in STATE_DIR/prometheus/targets/*.json (file-based
# service discovery: write a file there and the target is scraped a moment later; give each the
# labels a PodMonitor would, `namespace` and `pod`) with honor_labels, as the chart's PodMonitors,
# and evaluating every second the rule files in STATE_DIR/prometheus/rules/*.yaml.
# Usage: start-prometheus.sh STATE_DIR   (writes STATE_DIR/prometheus.env and prometheus.pid;
# env-down.sh STATE_DIR stops it)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"
state="$1"

prom="$(command -v prometheus || true)"
[ -n "$prom" ] || die "prometheus is missing (bash test/env/deps.sh system installs Debian's package)"
dir="$state/prometheus"
mkdir -p "$dir/targets" "$dir/rules" "$dir/data"
port="$(free_port)"
cat >"$dir/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $dir/rules/*.yaml
scrape_configs:
  - job_name: flashsale
    honor_labels: true
    file_sd_configs:
      - files: ['$dir/targets/*.json']
        refresh_interval: 1s
YAML
nohup "$prom" --config.file "$dir/prometheus.yml" --storage.tsdb.path "$dir/data" \
  --web.listen-address "127.0.0.1:$port" --web.enable-lifecycle \
  --storage.tsdb.retention.time 1d --log.level warn >"$state/prometheus.log" 2>&1 &
echo $! >"$state/prometheus.pid"
wait_up "prometheus" 60 "$(cat "$state/prometheus.pid")" "$state/prometheus.log" \
  curl -fsS "http://127.0.0.1:$port/-/ready"
cat >"$state/prometheus.env" <<ENV
PROMETHEUS_URL=http://127.0.0.1:$port
PROMETHEUS_TARGETS_DIR=$dir/targets
PROMETHEUS_RULES_DIR=$dir/rules
ENV
log "prometheus ready on 127.0.0.1:$port"
