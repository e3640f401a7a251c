#!/usr/bin/env bash
# `kiln build` as whole processes, the way a user runs it: cold (empty timing cache) vs warm, the
# median of 5 cold and 15 warm runs (3 after each cold one), next to the bare process start-up
# (`kiln --version`, mean of 10). kiln_bench_build measures the builder inside one process; this
# adds what each process pays again: loading the shared libraries, one-time library set-up,
# writing the engine file durably (fsync + rename).
#   bench/build/cli_cold_warm.sh MODEL [KILN]     e.g. bench/build/cli_cold_warm.sh bert_tiny
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
m=${1:?usage: cli_cold_warm.sh MODEL [KILN]}
kiln=${2:-build/tools/kiln/kiln}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read -r -a profile < <(python3 - "zoo/$m/info.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["profile"]
x = lambda v: "x".join(map(str, v))
print(" ".join(f"--profile {k}:{x(v['min'])},{x(v['opt'])},{x(v['max'])}" for k, v in p.items()))
PY
)
now_us() { echo $(($(date +%s%N) / 1000)); }
build() {
  "$kiln" build "zoo/$m/model.onnx" "${profile[@]}" --timing-cache "$work/cache" -o "$work/e.kiln" \
    >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
}
cold=() warm=()
for _ in 1 2 3 4 5; do
  rm -f "$work/cache"
  t=$(now_us); build; cold+=($(($(now_us) - t)))
  for _ in 1 2 3; do t=$(now_us); build; warm+=($(($(now_us) - t))); done
done
t=$(now_us)
for _ in $(seq 10); do "$kiln" --version >/dev/null; done
start=$((($(now_us) - t) / 10))
python3 - "$m" "$start" "${cold[*]}" "${warm[*]}" <<'PY'
import json, statistics, sys
m, start, cold, warm = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
c = statistics.median(map(int, cold)) / 1e3
w = statistics.median(map(int, warm)) / 1e3
print(json.dumps({"model": m, "cold_ms": c, "warm_ms": w, "cold_over_warm": round(c / w, 2),
                  "process_start_ms": start / 1e3}))
PY
