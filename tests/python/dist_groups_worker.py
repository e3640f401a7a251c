"""One rank of test_distributed_groups.py, launched by torchrun on gloo (CPU): builds the MLP of
conftest.py through kiln.distributed in the scenario asked for and writes what it saw as JSON."""
import argparse
import datetime
import hashlib
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import kiln  # noqa: E402

PROFILE = {"input_0": ((1, 8), (4, 8), (16, 8))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True)
    p.add_argument("--onnx", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []

    def save():
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world": world, "attempts": results}, f)

    def attempt(label, **kw):
        t0 = time.monotonic()
        r = {"label": label}
        try:
            e = kiln.distributed.build(args.onnx, backend="cpu", profiles=PROFILE, **kw)
            r["sha256"] = hashlib.sha256(e.serialize()).hexdigest()
            r["report"] = e.build_once_report
            r["out"] = e.create_execution_context()(torch.ones(2, 8)).tolist()
        except kiln.KilnError as err:
            r.update(code=err.code, builder_code=err.builder_code, message=err.message)
        r["seconds"] = time.monotonic() - t0
        results.append(r)
        save()

    cache = os.path.join(args.out, "cache")
    if args.scenario == "groups":
        os.environ["KILN_DIST_NODE"] = f"node{rank // 2}"  # two "nodes" of two ranks each
        attempt("per-node", build_on="per-node")
        attempt("per-arch", build_on="per-arch")  # one architecture here: one group
        # A group of ranks 0 and 1 only cannot make sub-groups (new_group needs every rank).
        os.environ["KILN_DIST_NODE"] = f"node{rank}"
        sub = dist.new_group(ranks=[0, 1])
        if rank < 2:
            attempt("subgroup-per-node", group=sub, build_on="per-node")
            attempt("subgroup-rank0", group=sub)
        dist.barrier()
    elif args.scenario == "cache":
        os.environ["KILN_DIST_NODE"] = f"node{rank // 2}"
        attempt("per-node-cold", build_on="per-node", cache_dir=cache)
        attempt("rank0-warm", cache_dir=cache)
        dist.barrier()
    elif args.scenario == "vanish":
        # The builder dies (SIGKILL) in the middle of its build. The launcher then sends the
        # survivors SIGTERM when it next looks (every 10 s), which can come before they have
        # written what they saw: they ignore it (the launcher's SIGKILL follows 30 s later, past
        # the bound the test asserts), so what is tested is kiln's bound, not the launcher's timing.
        if rank != 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        progress = (lambda *a: os.kill(os.getpid(), signal.SIGKILL)) if rank == 0 else None
        attempt("vanish", progress=progress, wait_timeout=60.0, heartbeat_timeout=20.0)
    elif args.scenario == "lose-rank":
        # The last rank (not a builder) leaves the job while rank 0 builds (about 3 s of progress
        # steps): its process exits, status 0, so the launcher keeps the others running. It
        # leaves once rank 0's build has begun (rank 0's first progress step writes a file), not
        # after a fixed delay, which on a loaded machine can run out before the build starts.
        started = os.path.join(args.out, "build-started")
        if rank == world - 1:
            def leave():
                deadline = time.monotonic() + 60
                while not os.path.exists(started) and time.monotonic() < deadline:
                    time.sleep(0.05)
                os._exit(0)
            threading.Thread(target=leave, daemon=True).start()

        def step(*a):
            if not os.path.exists(started):
                open(started, "w").close()
            time.sleep(0.3)
        progress = step if rank == 0 else None
        attempt("lose-rank", progress=progress, wait_timeout=60.0, transfer_timeout=10.0,
                heartbeat_timeout=20.0)
    else:
        raise SystemExit(f"unknown scenario {args.scenario}")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
