#!/usr/bin/env bash
# Throughput of `kiln doctor logs` on a generated mixed log, single-threaded and pinned to one core,
# against grep -E with five patterns on the same file.
# Usage: bench/doctor/run.sh [SIZE_MB]   (default 1024; use 50 for a smoke run)
# Env: KILN=path/to/kiln (default build/tools/kiln/kiln); RESULT_JSON=path writes the figures as
# JSON too (bench/doctor/results/ keeps the committed ones). The log goes to a temporary directory and
# is removed afterwards. Reports wall time and CPU time (user+sys); on a loaded machine the CPU time
# is the figure for "one core".
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE_MB=${1:-1024}
KILN=${KILN:-build/tools/kiln/kiln}
[ -x "$KILN" ] || { echo "build kiln first: cmake --build build --target kiln" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log="$tmp/mixed.log"
python3 bench/doctor/gen_mixed_log.py --mb "$SIZE_MB" --out "$log"
cat "$log" > /dev/null  # both runs read from the page cache
python3 - "$KILN" "$log" <<'PY'
import json, os, resource, shutil, subprocess, sys, time
kiln, log = sys.argv[1], sys.argv[2]
pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []

def timed(cmd):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(pin + cmd, stdout=subprocess.PIPE)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return p, wall, cpu

mb = os.path.getsize(log) / 1e6
p, kw, kc = timed([kiln, "doctor", "logs", log, "--json"])
d = json.loads(p.stdout)
g, gw, gc = timed(["grep", "-E", "-c", "NVRM: Xid|NCCL WARN|Watchdog caught|CUDA error|out of memory", log])
root = d["root_cause"]["id"] if d["root_cause"] else None
print(f"input             {mb:.0f} MB, {d['stats']['lines']} lines, {d['stats']['matches']} signature matches")
print(f"kiln doctor logs  wall {kw:6.2f} s {mb / kw:6.0f} MB/s | cpu {kc:6.2f} s {mb / kc:6.0f} MB/s  (exit {p.returncode}, root cause {root})")
print(f"grep -E, 5 pat.   wall {gw:6.2f} s {mb / gw:6.0f} MB/s | cpu {gc:6.2f} s {mb / gc:6.0f} MB/s  ({g.stdout.decode().strip()} lines)")
print(f"kiln/grep speed   wall {gw / kw:.2f} | cpu {gc / kc:.2f}")
out = os.environ.get("RESULT_JSON")
if out:
    with open(out, "w") as f:
        json.dump({"command": " ".join(["bench/doctor/run.sh", str(round(mb))]),
                   "input_mb": round(mb, 1), "lines": d["stats"]["lines"],
                   "signature_matches": d["stats"]["matches"], "root_cause": root,
                   "kiln_wall_s": round(kw, 3), "kiln_cpu_s": round(kc, 3),
                   "kiln_mb_per_s_wall": round(mb / kw, 1), "kiln_mb_per_s_cpu": round(mb / kc, 1),
                   "grep_wall_s": round(gw, 3), "grep_cpu_s": round(gc, 3),
                   "grep_mb_per_s_wall": round(mb / gw, 1), "grep_mb_per_s_cpu": round(mb / gc, 1),
                   "grep_command": "grep -E -c 'NVRM: Xid|NCCL WARN|Watchdog caught|CUDA error|out of memory'",
                   "pinned_to_one_core": bool(pin), "load_average": os.getloadavg()[0]}, f, indent=2)
        f.write("\n")
PY
