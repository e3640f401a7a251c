#!/usr/bin/env bash
# CI check for kiln's Prometheus surface: starts `kiln monitor` on a free port, scrapes /metrics
# into `promtool check metrics`, checks the port-in-use error and the textfile written on
# SIGTERM, then runs `promtool check rules` and `promtool test rules` on monitoring/.
# With a stand-in NVML library (tests/obs/fake_nvml.cc) it also scrapes a monitor that samples two
# scripted GPUs, so the kiln_gpu_* metrics and detector counters are linted too.
# Usage: scripts/check_metrics.sh [path/to/kiln [path/to/libfake_nvml.so]]
# Exits non-zero on the first failure. Needs promtool (Debian package "prometheus").
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kiln="${1:-$root/build/tools/kiln/kiln}"
fake_nvml="${2:-}"
fail() { echo "check_metrics: FAIL: $*" >&2; exit 1; }

[ -x "$kiln" ] || fail "kiln binary '$kiln' not found (build it first)"
command -v promtool >/dev/null || fail "promtool not found (apt-get install prometheus)"

tmp="$(mktemp -d)"
monitor_pid=""
cleanup() {
  if [ -n "$monitor_pid" ] && kill -0 "$monitor_pid" 2>/dev/null; then kill "$monitor_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# Fetches a URL with curl, or python3 where curl is absent.
fetch() {
  if command -v curl >/dev/null; then
    curl -sS --max-time 5 "$1"
  else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
  fi
}

# 1. A running monitor (no GPU here is fine: it serves kiln's own metrics with kiln_nvml_up 0).
"$kiln" monitor --metrics-port 0 --metrics-bind 127.0.0.1 --duration 10s --interval 200ms \
  --metrics-file "$tmp/kiln.prom" >"$tmp/out" 2>"$tmp/err" &
monitor_pid=$!
url=""
for _ in $(seq 1 100); do  # up to 10 s for the "serving" line
  url="$(grep -o 'http://[^ ]*/metrics' "$tmp/out" 2>/dev/null || true)"
  [ -n "$url" ] && break
  kill -0 "$monitor_pid" 2>/dev/null || { cat "$tmp/err" >&2; fail "kiln monitor exited early"; }
  sleep 0.1
done
[ -n "$url" ] || fail "kiln monitor did not print its metrics URL within 10 s"
echo "check_metrics: scraping $url"
sleep 0.5  # let the sampler run a few rounds (when a GPU is present)
fetch "$url" >"$tmp/scrape.txt" || fail "scrape of $url failed"
grep -q '^kiln_up 1$' "$tmp/scrape.txt" || fail "scrape lacks 'kiln_up 1'"
grep -q '^kiln_nvml_up [01]$' "$tmp/scrape.txt" || fail "scrape lacks kiln_nvml_up"
promtool check metrics <"$tmp/scrape.txt" || fail "promtool check metrics rejected the scrape"
echo "check_metrics: scrape OK ($(grep -c '^kiln_' "$tmp/scrape.txt") kiln samples)"

# 2. The port in use: a second monitor on the same port fails with KILN-E8000.
port="${url##*:}"; port="${port%%/*}"
if "$kiln" monitor --metrics-port "$port" --metrics-bind 127.0.0.1 --duration 1s >/dev/null 2>"$tmp/err2"; then
  fail "a second monitor on port $port did not fail"
fi
grep -q 'KILN-E8000' "$tmp/err2" || { cat "$tmp/err2" >&2; fail "port in use did not report KILN-E8000"; }
echo "check_metrics: port in use reported as KILN-E8000"

# 3. SIGTERM stops the monitor cleanly; its textfile then says kiln_up 0.
kill -TERM "$monitor_pid"
for _ in $(seq 1 100); do kill -0 "$monitor_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$monitor_pid" 2>/dev/null && fail "kiln monitor did not stop within 10 s of SIGTERM"
wait "$monitor_pid" || fail "kiln monitor exited non-zero after SIGTERM"
monitor_pid=""
grep -q '^kiln_up 0$' "$tmp/kiln.prom" || fail "textfile lacks 'kiln_up 0' after exit"
promtool check metrics <"$tmp/kiln.prom" || fail "promtool check metrics rejected the textfile"
echo "check_metrics: textfile OK"

# 4. GPU metrics from the stand-in NVML (two GPUs; GPU 1 reports thermal + HW slowdown).
if [ -n "$fake_nvml" ]; then
  "$kiln" monitor --metrics-port 0 --metrics-bind 127.0.0.1 --duration 10s --interval 100ms \
    --nvml-library "$fake_nvml" >"$tmp/out3" 2>"$tmp/err3" &
  monitor_pid=$!
  url=""
  for _ in $(seq 1 100); do
    url="$(grep -o 'http://[^ ]*/metrics' "$tmp/out3" 2>/dev/null || true)"
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$tmp/err3" >&2; fail "monitor with $fake_nvml did not start"; }
  sleep 0.5
  fetch "$url" >"$tmp/scrape_gpu.txt" || fail "scrape of $url failed"
  kill -TERM "$monitor_pid"; wait "$monitor_pid" || fail "monitor with stand-in NVML exited non-zero"
  monitor_pid=""
  for want in '^kiln_nvml_up 1$' '^kiln_gpu_devices 2$' '^kiln_gpu_utilization_ratio{gpu="0"} 0.87$' \
      '^kiln_gpu_health_events_total{gpu="1",kind="throttling"} 1$' \
      '^kiln_errors_total{code="KILN-E8009"} 1$'; do
    grep -q "$want" "$tmp/scrape_gpu.txt" || { cat "$tmp/scrape_gpu.txt" >&2; fail "GPU scrape lacks $want"; }
  done
  promtool check metrics <"$tmp/scrape_gpu.txt" || fail "promtool check metrics rejected the GPU scrape"
  echo "check_metrics: GPU scrape (stand-in NVML) OK ($(grep -c '^kiln_gpu' "$tmp/scrape_gpu.txt") GPU samples)"
fi

# 5. The alert rules and their unit tests.
promtool check rules "$root/monitoring/kiln-rules.yml" || fail "promtool check rules"
promtool test rules "$root/monitoring/kiln-rules.test.yml" || fail "promtool test rules"
echo "check_metrics: all checks passed"
