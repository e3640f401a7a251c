#!/usr/bin/env python3
"""Builder benchmark over the zoo (issue 3): build time with a cold vs a warm timing cache, and
engine latency with passes + tactic search vs no passes + heuristic tactics, on the CPU.

Runs build/bench/build/kiln_bench_build once per model (every ratio is measured inside one
process, so both sides see the same machine load), writes bench/results/build_cpu.json (with the
command that produced it) and prints a table.

  python3 bench/build/run_build_bench.py                      # the committed zoo
  python3 bench/build/run_build_bench.py --generated zoo/generated   # + resnet50, bert_base
"""
import argparse
import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def models_in(directory):
    if not directory or not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, m) for m in os.listdir(directory)
                  if os.path.exists(os.path.join(directory, m, "model.onnx")))


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def git_commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/bench/build/kiln_bench_build"))
    ap.add_argument("--zoo", default=os.path.join(ROOT, "zoo"))
    ap.add_argument("--generated", default=os.path.join(ROOT, "zoo/generated"),
                    help="large models (tools/zoo/export_zoo.py --large); used when present")
    ap.add_argument("--models", default="", help="comma-separated names to keep (default: all)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/build_cpu.json"))
    ap.add_argument("--rounds", type=int, default=3, help="latency rounds per engine, small models")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per model")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment for the benchmark processes (recorded in the JSON), e.g. "
                         "OMP_WAIT_POLICY=passive")
    args = ap.parse_args()

    env = dict(os.environ)
    env.update(dict(kv.split("=", 1) for kv in args.env))
    load_at_start = os.getloadavg()
    small = models_in(args.zoo)
    large = models_in(args.generated)
    keep = set(filter(None, args.models.split(",")))
    rows, failures = [], []
    for path in small + large:
        name = os.path.basename(path)
        if keep and name not in keep:
            continue
        is_large = path in large
        # Large models: one latency round of a few runs (one inference takes seconds on 2 cores).
        # Large models: one cold build (a minute each); small ones: median of three.
        cmd = [args.binary, "--model", path,
               "--cold-runs", "1" if is_large else "5",
               "--warm-runs", "3" if is_large else "25",
               "--rounds", "1" if is_large else str(args.rounds),
               "--seconds", "0" if is_large else "0.5",
               "--min-iterations", "3" if is_large else "10"]
        print(f"== {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        except subprocess.TimeoutExpired:
            failures.append({"model": name, "error": f"timed out after {args.timeout} s"})
            continue
        if p.returncode != 0:
            failures.append({"model": name, "error": p.stderr.strip()[-2000:]})
            print(p.stderr, file=sys.stderr)
            continue
        row = json.loads(p.stdout.strip().splitlines()[-1])
        row["large"] = is_large
        # Rounds alternate between the engines, so round i of each saw about the same load: the
        # per-round ratios are less exposed to load changing during the run than the ratio of the
        # two medians ("speedup"), which stays the headline figure.
        pairs = list(zip(row["latency_tuned_rounds_ms"], row["latency_baseline_rounds_ms"]))
        ratios = sorted(b / t for t, b in pairs if t > 0)
        row["speedup_paired_median"] = ratios[len(ratios) // 2] if ratios else None
        row["rounds_tuned_faster"] = f"{sum(1 for t, b in pairs if t < b)} of {len(pairs)}"
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)

    summary = {
        "geomean_cold_over_warm": geomean([r["cold_over_warm"] for r in rows]),
        "min_cold_over_warm": min((r["cold_over_warm"] for r in rows), default=None),
        "warm_10x_target_met_by": [r["model"] for r in rows if r["cold_over_warm"] >= 10],
        "warm_10x_target_missed_by": [r["model"] for r in rows if r["cold_over_warm"] < 10],
        "geomean_latency_speedup": geomean([r["speedup"] for r in rows]),
        "geomean_latency_speedup_paired_median":
            geomean([r["speedup_paired_median"] for r in rows]),
    }
    result = {
        "benchmark": "kiln builder on the CPU backend: cold vs warm timing cache; "
                     "passes + tactic search vs no passes + heuristic tactics",
        "command": "python3 " + shlex.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": git_commit(),
        "environment": {k: v for k, v in env.items()
                        if k.startswith(("OMP_", "GOMP_", "KMP_", "DNNL_", "OPENBLAS_", "KILN_"))},
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                    "load_average_at_start": load_at_start,
                    "load_average_at_end": os.getloadavg()},
        "definitions": {
            "build_cold_s": "import + build + serialize with an empty timing cache (every "
                            "distinct layer signature timed), wall seconds, median of 3 builds "
                            "in one process (1 for the large models)",
            "build_warm_s": "the same build again with the cache the cold build wrote "
                            "(median of 9; 3 for the large models)",
            "latency_tuned_ms": "median latency of the passes + tactic-search engine at the "
                                "profile's opt shapes (median over rounds)",
            "latency_baseline_ms": "the same for no passes (--no-optimize) + each layer's "
                                   "heuristic tactic (BuilderConfig::search_tactics = false)",
            "speedup": "latency_baseline_ms / latency_tuned_ms",
            "speedup_paired_median": "median over rounds of baseline / tuned in the same round",
            "rounds_tuned_faster": "rounds in which the tuned engine's median was the lower",
        },
        "summary": summary,
        "results": rows,
        "failures": failures,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    hdr = (f"{'model':<18} {'layers':>6} {'cold s':>8} {'warm s':>8} {'cold/warm':>9} "
           f"{'timed':>6} {'hits':>5} {'tuned ms':>9} {'base ms':>9} {'speedup':>7}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['model']:<18} {r['layers']:>6} {r['build_cold_s']:>8.2f} "
              f"{r['build_warm_s']:>8.3f} {r['cold_over_warm']:>8.1f}x "
              f"{r['build_cold_tactics_timed']:>6} {r['build_warm_cache_hits']:>5} "
              f"{r['latency_tuned_ms']:>9.3f} {r['latency_baseline_ms']:>9.3f} "
              f"{r['speedup']:>6.2f}x")
    if summary["geomean_cold_over_warm"]:
        print(f"geomean cold/warm {summary['geomean_cold_over_warm']:.1f}x "
              f"(min {summary['min_cold_over_warm']:.1f}x; target >= 10x), "
              f"geomean latency speedup {summary['geomean_latency_speedup']:.2f}x")
    for f in failures:
        print(f"FAILED {f['model']}: {f['error']}")
    print(f"wrote {os.path.relpath(args.out, ROOT)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
