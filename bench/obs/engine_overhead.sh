#!/usr/bin/env bash
# Metrics overhead on a running engine: `kiln run` throughput without metrics vs with
# --metrics-port and a Prometheus-style scrape every second, alternating A/B rounds in one run.
# Usage: bench/obs/engine_overhead.sh ENGINE [ROUNDS] [SECONDS]
set -euo pipefail
engine=$1; rounds=${2:-3}; secs=${3:-4}
kiln=${KILN:-build/tools/kiln/kiln}
port=$((20000 + RANDOM % 20000))
thr() { python3 -c 'import json,sys; print(json.load(sys.stdin)["throughput_per_s"])'; }
a=(); b=()
for r in $(seq "$rounds"); do
  a+=("$($kiln run "$engine" --json --duration "$secs" --warmup 20 | thr)")
  ( for i in $(seq $((secs + 2))); do sleep 1; curl -s "http://127.0.0.1:$port/metrics" >/dev/null || true; done ) &
  scraper=$!
  b+=("$($kiln run "$engine" --json --duration "$secs" --warmup 20 --metrics-port $port | thr)")
  kill $scraper 2>/dev/null || true; wait $scraper 2>/dev/null || true
done
python3 - "${a[*]}" "${b[*]}" <<'PY'
import sys, statistics as s
a = [float(x) for x in sys.argv[1].split()]; b = [float(x) for x in sys.argv[2].split()]
ma, mb = s.median(a), s.median(b)
print(f"without metrics: {ma:.1f} inferences/s {a}")
print(f"with metrics + 1 scrape/s: {mb:.1f} inferences/s {b}")
print(f"throughput ratio with/without: {mb/ma:.4f}  (overhead {100*(1-mb/ma):+.2f}%)")
PY
