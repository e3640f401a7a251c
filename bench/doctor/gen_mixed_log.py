#!/usr/bin/env python3
"""Writes a mixed log of a given size for `kiln doctor logs` throughput runs (bench/doctor/run.sh).

The mix follows a busy 16-rank job: NCCL INFO lines, PyTorch/torchrun progress, TensorRT build
output, kernel log lines, nvidia-smi CSV samples, kiln log lines, environment lines, a few invalid
UTF-8 bytes, and rare failures (one line in about 20,000 matches an error signature). The output
is written in 4 MiB blocks drawn at random from line pools, so generation stays fast.
"""
import argparse
import random

HOSTS = [f"gpu-node-{c}" for c in "abcd"]


def pools(rng):
    info = []
    for h in HOSTS:
        for dev in range(8):
            pid = 40000 + dev
            info.append(f"{h}:{pid}:{pid + 61} [{dev}] NCCL INFO Channel {dev:02d}/32 : 0[{dev}] -> 1[{(dev + 1) % 8}] via P2P/CUMEM/read")
            info.append(f"{h}:{pid}:{pid + 61} [{dev}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1")
            info.append(f"{h}:{pid}:{pid + 61} [{dev}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ens5:10.10.1.{dev}<0>")
            info.append(f"{h}:{pid}:{pid + 61} [{dev}] NCCL INFO Channel {dev:02d}/0 : 8[{dev}] -> 0[0] [send] via NET/IB/0/GDRDMA")
            info.append(f"{h}:{pid}:{pid + 61} [{dev}] NCCL INFO Using network IB")
    # One init line per rank and communicator: rare in a long run, but each one is parsed.
    init = [f"{h}:{40000 + dev}:{40061 + dev} [{dev}] NCCL INFO comm 0x55d0c8a0{c:04x} rank {hi * 8 + dev} nranks 32 cudaDev {dev} nvmlDev {dev} busId {dev:02x}000 commId 0x8b7a3d1f0e2c{c:04x} - Init COMPLETE"
            for hi, h in enumerate(HOSTS) for dev in range(8) for c in range(64)]
    train = [f"[rank{r}]:[2026-06-20 10:{m:02d}:{s:02d},{ms:03d}] train: [INFO] step {r * 1000 + m * 60 + s} loss {1 + rng.random():.4f} lr 3.0e-04 grad_norm {rng.random():.3f} tokens/s {400000 + rng.randrange(20000)}"
             for r in range(16) for m in range(0, 60, 7) for s in range(0, 60, 11) for ms in (0, 500)]
    trt = [f"[rank{r}]:[06/20/2026-10:{m:02d}:{s:02d}] [TRT] [V] Tactic: 0x{rng.randrange(1 << 63):016x} Time: {rng.random():.5f}"
           for r in range(16) for m in range(60) for s in range(0, 60, 13)]
    trt += [f"[rank{r}]:[06/20/2026-10:00:0{r % 10}] [TRT] [I] [MemUsageChange] Init CUDA: CPU +2, GPU +0, now: CPU 1532, GPU {30000 + r} (MiB)" for r in range(16)]
    # TensorRT's C++/trtexec logger order ("[E] [TRT]"), srun --label and kubectl --timestamps wrappers.
    trt += [f"[06/20/2026-10:{m:02d}:{s:02d}] [I] [TRT] [GraphReduction] The approximate region cut reduction algorithm is called."
            for m in range(60) for s in range(0, 60, 9)]
    wrapped = [f"{r:2d}: [2026-06-20 10:{m:02d}:{s:02d},000] train: [INFO] step {m * 60 + s} loss {1 + rng.random():.4f}"
               for r in range(16) for m in range(0, 60, 5) for s in range(0, 60, 15)]
    wrapped += [f"2026-06-20T10:{m:02d}:{s:02d}.{rng.randrange(10**9):09d}Z [rank{r}]:[06/20/2026-10:{m:02d}:{s:02d}] [TRT] [W] TensorRT encountered issues when converting weights between types and that could affect accuracy."
                for r in range(16) for m in range(0, 60, 5) for s in range(0, 60, 15)]
    kern = [f"Jun 20 10:{m:02d}:{s:02d} {h} kernel: [{86970 + m * 60 + s:6d}.{rng.randrange(10**6):06d}] {msg}"
            for h in HOSTS for m in range(0, 60, 3) for s in range(0, 60, 17)
            for msg in ("audit: type=1400 audit(1781949600.123:412): apparmor=\"STATUS\" operation=\"profile_load\"",
                        "EXT4-fs (nvme0n1p2): re-mounted. Opts: errors=remount-ro",
                        "mlx5_core 0000:5e:00.0: mlx5_fw_tracer_handle_traces:714:(pid 412): FW tracer event")]
    torchrun = [f"[2026-06-20 10:{m:02d}:00,{ms:03d}] torch.distributed.elastic.agent.server.api: [INFO] [default] worker group heartbeat ok"
                for m in range(60) for ms in range(0, 1000, 250)]
    kiln = [f"[kiln INFO BUILD] phase=tactics layer={l} tactic=f16-conv-nhwc-cudnn-engine{l % 40} ms={rng.random():.3f}" for l in range(400)]
    smi = [f"2026/06/20 10:{m:02d}:{s:02d}.{ms:03d}, {i}, NVIDIA H100 80GB HBM3, 00000000:{0x18 + i:02X}:00.0, {50000 + rng.randrange(10000)} MiB, 81559 MiB, 0, {55 + i}"
           for m in range(60) for s in range(0, 60, 10) for ms in (1,) for i in range(8)]
    env = ["NCCL_DEBUG=INFO", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", "OMP_NUM_THREADS=1", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"]
    junk = ["\xff\xfe binary junk \x00\x01 from a crashed writer", "caf\xe9 latin-1 text", "\x1b[1;32mcoloured progress 42%\x1b[0m"]
    failures = [
        "gpu-node-b:40003:40064 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.10.1.11<52345> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
        "[rank7]:[E620 10:50:02.300100 40007 ProcessGroupNCCL.cpp:616] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88213, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600091 milliseconds before timing out.",
        "[rank3]: RuntimeError: CUDA error: unspecified launch failure",
        "Jun 20 10:40:01 gpu-node-a kernel: [ 8790.332218] NVRM: Xid (PCI:0000:c6:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[06/20/2026-10:41:07] [E] [TRT] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory (no further information)",
        " 5: RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(...)`",
    ]
    weighted = [(info, 40), (init, 0.05), (train, 25), (trt, 15), (kern, 6), (wrapped, 3), (torchrun, 5), (kiln, 5), (smi, 1), (env, 0.2), (junk, 0.3)]
    return weighted, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=1024, help="size in MB (10^6 bytes)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    weighted, failures = pools(rng)
    groups = [g for g, _ in weighted]
    weights = [w for _, w in weighted]
    target = args.mb * 10**6
    written = 0
    with open(args.out, "wb") as f:
        while written < target:
            lines = []
            size = 0
            for g in rng.choices(groups, weights, k=40000):
                line = rng.choice(g)
                lines.append(line)
                size += len(line) + 1
            for _ in range(2):
                lines.insert(rng.randrange(len(lines)), rng.choice(failures))
            block = ("\n".join(lines) + "\n").encode("latin-1")
            block = block[: target - written] if written + len(block) > target else block
            f.write(block)
            written += len(block)


if __name__ == "__main__":
    main()
