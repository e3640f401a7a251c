"""`kiln refit --distributed` as a job runs it (issue 20): every rank runs the same command. When
every rank has the new weights each refits locally and nothing is sent; when only some do, the
lowest of them computes the refit and broadcasts the constants that changed. Either way every
rank's engine is byte-identical to `kiln build` of the new weights. Ranks launched like torchrun
(environment, TCP through rank 0) and, where mpirun exists, by mpirun. Bad input fails on every
rank with a catalog error and leaves every engine file as it was; a missing rank is named within
the join bound."""
import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

import refit_cli_test  # noqa: E402  (same directory)


def env_for(rank, world, port):
    env = dict(os.environ)
    for var in list(env):
        if var.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_",
                           "OMPI_", "PMIX_", "MASTER_")):
            del env[var]
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port)})
    return env


def free_port():
    """A port the OS has just found free (a port derived from the pid could be one that another
    test running at the same time listens on, and its rendezvous would take these ranks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(kiln, per_rank, world=None, extra=(), timeout=60):
    """Starts one kiln process per entry of per_rank (rank -> argument list), torchrun-style.
    Returns {rank: (rc, stdout, stderr)} and the wall time."""
    world = world or len(per_rank)
    port = free_port()
    t0 = time.monotonic()
    procs = {r: subprocess.Popen([kiln, "refit", *args, "--distributed", *extra],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env_for(r, world, port))
             for r, args in per_rank.items()}
    out = {}
    for r, p in procs.items():
        so, se = p.communicate(timeout=timeout)
        out[r] = (p.returncode, so, se)
    return out, time.monotonic() - t0


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    a.kiln, a.source = os.path.abspath(a.kiln), os.path.abspath(a.source)
    zoo = os.path.join(a.source, "zoo")
    run = refit_cli_test.run
    profile = refit_cli_test.zoo_profile(zoo)
    with tempfile.TemporaryDirectory() as tmp:
        model_a, model_b, engine_a, engine_b = refit_cli_test.models_and_engines(
            a, tmp, zoo, profile)
        fresh_b, old = read(engine_b), read(engine_a)
        missing = os.path.join(tmp, "not-on-this-node", "model.onnx")

        def outs(tag, n):
            return [os.path.join(tmp, f"{tag}{r}.kiln") for r in range(n)]

        # 1. Every rank holds the weights: each refits locally, nothing is sent.
        o = outs("local", 3)
        res, _ = torchrun(a.kiln, {r: [engine_a, "--weights", model_b, "-o", o[r], "--json"]
                                   for r in range(3)})
        for r, (rc, so, se) in res.items():
            assert rc == 0, (r, so, se)
            rep = json.loads(so)
            assert rep["mode"] == "local" and rep["rank"] == r and rep["world_size"] == 3, rep
            assert rep["bytes_sent"] == 0 and rep["holders"] == [0, 1, 2], rep
            assert rep["refit"]["constants_refit"] > 0, rep
            assert read(o[r]) == fresh_b, f"rank {r}: not B's engine"

        # 2. Only rank 1 holds them (the path is missing elsewhere): it refits and relays the
        # changed constants; rank 0 relays the TCP frames. Every engine is B's, byte for byte.
        o = outs("relay", 3)
        report = os.path.join(tmp, "relay_report{}.json")
        res, _ = torchrun(a.kiln, {r: [engine_a, "--weights", model_b if r == 1 else missing,
                                       "-o", o[r], "--dist-report", report.format(r)]
                                   for r in range(3)})
        for r, (rc, so, se) in res.items():
            assert rc == 0, (r, so, se)
            rep = json.loads(read(report.format(r)))
            assert rep["mode"] == "relay" and rep["source"] == 1 and rep["holders"] == [1], rep
            assert rep["constants_sent"] > 0 and rep["bytes_sent"] > 0, rep
            assert read(o[r]) == fresh_b, f"rank {r}: the relayed engine is not B's"
            if r != 1:
                assert "not on this rank's file system" in se, se
            assert "relay" in so and f"wrote {o[r]}" in so, so

        # 3. In place on every rank, the holder's weights of another architecture: KILN-E4008 on
        # every rank, naming an initializer, and every engine file unchanged.
        o = outs("inplace", 3)
        for path in o:
            shutil.copyfile(engine_a, path)
        bert = os.path.join(zoo, "bert_tiny", "model.onnx")
        res, _ = torchrun(a.kiln, {r: [o[r], "--weights", bert if r == 0 else missing]
                                   for r in range(3)})
        for r, (rc, so, se) in res.items():
            assert rc == 1 and "KILN-E4008" in se and "initializer '" in se, (r, rc, se)
            assert read(o[r]) == old, f"rank {r}: a refused refit changed the engine"

        # 4. Holders with different weights: KILN-E7028 on every rank, naming the ranks.
        res, _ = torchrun(a.kiln, {r: [o[r], "--weights", (model_a, model_b, missing)[r]]
                                   for r in range(3)})
        for r, (rc, so, se) in res.items():
            assert rc == 1 and "KILN-E7028" in se and "rank 0" in se and "rank 1" in se, (r, se)
            assert read(o[r]) == old

        # 5. No rank holds the weights: every rank says so. Without --distributed, --weights is
        # required.
        r = run(a.kiln, "refit", o[0])
        assert r.returncode == 1 and "KILN-E1001" in r.stderr and "--weights" in r.stderr, r.stderr
        res, _ = torchrun(a.kiln, {r: [o[r], "--weights", missing] for r in range(2)})
        for r, (rc, so, se) in res.items():
            assert rc == 1 and "no rank of the 2 passed the new weights" in se, (r, se)

        # 6. A rank that never starts: the others fail within the join bound, naming it.
        res, elapsed = torchrun(a.kiln, {r: [o[r], "--weights", model_b] for r in range(2)},
                                world=3, extra=("--join-timeout", "3"))
        assert elapsed < 20, elapsed
        rc0, _, se0 = res[0]
        assert rc0 == 1 and "KILN-E7003" in se0 and "missing rank(s) 2" in se0, se0
        for r in range(3):
            assert read(o[r]) == old

        # 7. The same relay under mpirun (MPMD: rank 0 has the weights, ranks 1-2 do not).
        mpirun = shutil.which("mpirun")
        if mpirun:
            o = outs("mpi", 3)
            env = env_for(0, 1, 0)
            for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT"):
                env.pop(var)
            env.update({"OMPI_MCA_rmaps_base_oversubscribe": "1",
                        "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})
            root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
            cmd = [mpirun, *root, "-np", "1", a.kiln, "refit", engine_a, "--weights", model_b,
                   "-o", o[0], "--distributed", ":"]
            for r in (1, 2):
                cmd += ["-np", "1", a.kiln, "refit", engine_a, "--weights", missing, "-o", o[r],
                        "--distributed"] + ([":"] if r == 1 else [])
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
            assert p.returncode == 0, (p.stdout, p.stderr)
            assert p.stdout.count("relay") == 3, p.stdout
            for r in range(3):
                assert read(o[r]) == fresh_b, f"mpi rank {r}: not B's engine"
        else:
            print("mpirun not found: the MPI case was skipped")
    print("ok")


if __name__ == "__main__":
    main()
