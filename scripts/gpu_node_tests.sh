#!/usr/bin/env bash
# ONNX backend node tests on the CUDA backend (issue 21's GPU rate), on the GPU machine, whose
# onnx has no test data: carry it from this checkout's venv.
#   here:          tar -C .venv/lib/python3.11/site-packages/onnx/backend/test/data -czf .bundle_node.tgz node
#   GPU machine:   source scripts/gpu_env.sh && scripts/gpu_node_tests.sh [SHARDS] [BOUND_S] [OUT_DIR]
# Writes OUT_DIR/cuda_node_cases.json (every case's result) and prints the pass count, the failures
# by stage, and the expected-pass cases (tests/conformance/node_expected_pass.txt, the CPU's) that
# fail on CUDA. Cases run in worker processes (`kiln conformance`): a shard initialises CUDA once
# per run of passing cases.
set -u
shards=${1:-8}
bound=${2:-300}
out=${3:-${OUT:-/tmp}}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kiln=${KILN:-$root/.bundle/bin/kiln}
data=${KILN_NODE_DATA:-$root/.bundle_node.tgz}
t0=$(date +%s)
work=$(mktemp -d)
tar -C "$work" -xzf "$data" || { echo "gpu_node_tests.sh: cannot unpack $data" >&2; exit 2; }
ls -d "$work"/node/test_* > "$work/all.txt"
split -n "r/$shards" "$work/all.txt" "$work/shard_"
for f in "$work"/shard_*; do
  timeout "$bound" "$kiln" conformance --backend cuda --timeout 20 \
    --json "$work/$(basename "$f").json" $(cat "$f") > /dev/null 2>&1 &
done
wait
python3 - "$work" "$out" "$root/tests/conformance/node_expected_pass.txt" <<'PY'
import collections, glob, json, sys
work, out, expected_path = sys.argv[1:4]
cases = []
for f in sorted(glob.glob(work + "/shard_*.json")):
    try:
        cases += json.load(open(f))
    except Exception as e:
        print("unreadable shard report", f, e)
passed = sum(c["passed"] for c in cases)
print(f"cuda node tests: {passed} passed of {len(cases)} run (of 1765 in onnx 1.22)")
print("failures by stage:", collections.Counter(c["stage"] for c in cases if not c["passed"]).most_common())
expected = {l.strip() for l in open(expected_path) if l.strip() and not l.startswith("#")}
lost = sorted(c["name"] for c in cases if not c["passed"] and c["name"] in expected)
print(f"{len(lost)} case(s) that pass on the CPU fail on CUDA:", " ".join(lost[:40]))
json.dump(cases, open(out + "/cuda_node_cases.json", "w"))
PY
rm -rf "$work"
echo "gpu_node_tests.sh: $(( $(date +%s) - t0 )) s"
