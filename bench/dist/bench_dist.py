#!/usr/bin/env python3
"""Build-once benchmark on the CPU: time for N ranks (mpirun, oversubscribed on this machine) to
all hold an engine of 100 MB / 1 GB, shared through MPI (rank 0 builds, chunked MPI_Ibcast) and
through the file cache (one process builds, the others read the published entry), against every
rank building its own copy.

The build is synthetic: --build-ms of CPU time per build (a parameter, not a real engine build)
plus generating the bytes. Real builds cost minutes and GPU memory; the ratio therefore depends on
that parameter, and the transfer figures (bytes/s) are the part that does not.

    python3 bench/dist/bench_dist.py --driver build/tests/distributed/dist_driver \
        --out bench/results/dist_cpu.json
"""
import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "dist"))
from mpi_cases import mpirun_prefix, mpi_env  # noqa: E402


def run(driver, np_, size, build_ms, mode, tmp):
    rep = tempfile.mkdtemp(dir=tmp)
    args = [driver, "--size", str(size), "--build-ms", str(build_ms), "--build-cost", "cpu",
            "--report-dir", rep, "--wait-ms", "600000", "--transfer-ms", "600000"]
    if mode == "every-rank":
        args.append("--every-rank-builds")
    elif mode == "cache":
        args += ["--transport", "cache", "--cache-dir", os.path.join(tmp, "cache-" + os.path.basename(rep))]
    elif mode == "mpi":
        args += ["--transport", "mpi"]
    t0 = time.monotonic()
    env = mpi_env()
    # The tests turn cross-memory attach off for portability; the benchmark lets Open MPI use it
    # where the kernel allows (single copy by the receiver), as a real job would.
    env.pop("OMPI_MCA_btl_vader_single_copy_mechanism", None)
    p = subprocess.run(mpirun_prefix() + ["-np", str(np_)] + args, capture_output=True, text=True,
                       env=env, timeout=600)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{mode} np={np_} size={size}: rc={p.returncode}\n{p.stdout}\n{p.stderr[-2000:]}")
    elapsed = [float(l.split("elapsed=")[1]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    sums = {l.split("checksum=")[1].split()[0] for l in p.stdout.splitlines() if l.startswith("RESULT ")}
    assert len(elapsed) == np_ and len(sums) == 1, p.stdout
    reports = [json.load(open(f)) for f in glob.glob(os.path.join(rep, "*.json"))]
    row = {"mode": mode, "ranks": np_, "bytes": size, "build_ms": build_ms,
           "time_to_all_ranks_s": round(max(elapsed), 3), "mpirun_wall_s": round(wall, 3)}
    if mode == "mpi":
        table = reports[0]["ranks"]
        xfer = max(r["transfer_s"] for r in table if r["role"] == "received")
        row["transfer_s"] = round(xfer, 3)
        row["transfer_bytes_per_s"] = round(size / xfer) if xfer > 0 else None
        row["handshake_s"] = round(max(r["handshake_s"] for r in reports), 4)
    if mode == "cache":
        readers = [r["ranks"][0] for r in reports if r["ranks"][0]["role"] == "cache-hit"]
        builders = [r for r in reports if r["ranks"][0]["role"] == "built"]
        row["builders"] = len(builders)
        row["took_over"] = sum(1 for r in reports if r["ranks"][0]["role"] == "took-over")
        row["max_reader_wait_s"] = round(max((r["wait_s"] for r in readers), default=0), 3)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", default="build/tests/distributed/dist_driver")
    ap.add_argument("--out", default="bench/results/dist_cpu.json")
    ap.add_argument("--sizes", default="100000000,1000000000")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--build-ms", type=int, default=2000)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-bench-dist-", dir="/tmp")
    rows = []
    load_at_start = os.getloadavg()
    try:
        for size in map(int, a.sizes.split(",")):
            for np_ in map(int, a.ranks.split(",")):
                group = {}
                for mode in ("every-rank", "mpi", "cache"):
                    row = run(a.driver, np_, size, a.build_ms, mode, tmp)
                    group[mode] = row
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                for mode in ("mpi", "cache"):
                    group[mode]["speedup_vs_every_rank"] = round(
                        group["every-rank"]["time_to_all_ranks_s"] / group[mode]["time_to_all_ranks_s"], 2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {
        "command": " ".join(["python3"] + sys.argv),
        "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.machine()}",
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "notes": ("synthetic build: build_ms of CPU time per build plus generating the bytes; ranks "
                  "oversubscribe the cores, so concurrent builds contend as real ones do for a GPU. "
                  "MPI over shared memory with Open MPI's default single-copy mechanism (CMA where the "
                  "kernel allows). File cache on local disk (written with fsync, read from the page "
                  "cache). The development machine is shared with other builds: see the load averages."),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"{'mode':<11}{'ranks':>6}{'bytes':>12}{'time s':>9}{'xfer MB/s':>11}{'speedup':>9}")
    for r in rows:
        bps = r.get("transfer_bytes_per_s")
        print(f"{r['mode']:<11}{r['ranks']:>6}{r['bytes']:>12}{r['time_to_all_ranks_s']:>9.2f}"
              f"{(bps or 0) / 1e6:>11.0f}{r.get('speedup_vs_every_rank', 1.0):>9.2f}")


if __name__ == "__main__":
    main()
