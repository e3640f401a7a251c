"""DDP + AMP training with a per-epoch FP16 validation engine that is built once per job and shared.

The seed's pipeline, with kiln in it: every rank trains a small CNN under DistributedDataParallel
with mixed precision; after each epoch the job builds ONE FP16 kiln engine from the current
weights (kiln.build(..., distributed=True): rank 0 builds, the others receive the bytes over the
job's own process group), every rank validates its shard through kiln and through PyTorch, and
rank 0 prints a verification table (who built, engine digest on every rank, accuracy and error
against PyTorch).

    torchrun --nproc-per-node 2 examples/train.py --epochs 2          # CPU: gloo
    torchrun --nproc-per-node 8 examples/train.py --backend cuda      # GPUs: NCCL

Debian's torch 1.13 under Python 3.11: `python3 -m torch.distributed.run --standalone
--nproc_per_node 2 --redirects 9:1 --tee 9:1 examples/train.py` (its torchrun cannot parse its own
default for --redirects/--tee there; a mapping for a rank that does not exist works around it).
"""
import argparse
import contextlib
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kiln  # noqa: E402

CLASSES = 4


class SmallCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 4 * 4, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def synthetic(n, seed):
    """Images whose class is which quadrant is brightest: learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = torch.randn(n, 1, 16, 16, generator=g) * 0.5
    for c in range(CLASSES):
        r, q = divmod(c, 2)
        x[y == c, :, r * 8:(r + 1) * 8, q * 8:(q + 1) * 8] += 1.0
    return TensorDataset(x, y)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-size", type=int, default=512)
    p.add_argument("--val-size", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--backend", default="auto", help="kiln backend: auto, cpu or cuda")
    p.add_argument("--deadline", default="30s", help="bound on each engine build")
    p.add_argument("--json", help="write the verification table as JSON here (rank 0)")
    args = p.parse_args()

    use_cuda = torch.cuda.is_available() and args.backend != "cpu"
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else \
        torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "cuda" if use_cuda else "cpu"

    torch.manual_seed(0)
    model = DDP(SmallCnn().to(device), device_ids=[device.index] if use_cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # AMP: FP16 with a gradient scaler on the GPU, BF16 autocast on the CPU.
    amp_dtype = torch.float16 if use_cuda else torch.bfloat16
    scaler = (torch.amp.GradScaler("cuda", enabled=use_cuda) if hasattr(torch.amp, "GradScaler")
              else torch.cuda.amp.GradScaler(enabled=use_cuda))
    train = synthetic(args.train_size, seed=1)
    val = synthetic(args.val_size, seed=2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler)
    val_loader = DataLoader(val, batch_size=args.batch,
                            sampler=DistributedSampler(val, world, rank, shuffle=False))
    example = torch.zeros(args.batch, 1, 16, 16)
    profile = {"input_0": ((1, 1, 16, 16), (args.batch, 1, 16, 16), (args.batch, 1, 16, 16))}

    rows = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        loss_sum, steps = 0.0, 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            loss_sum += float(loss)
            steps += 1

        # One FP16 engine for the whole job, from this epoch's weights.
        t0 = time.monotonic()
        engine = kiln.build(model.module, example.to(device), backend=backend, fp16=True,
                            profiles=profile, deadline=args.deadline, output_names=["logits"],
                            distributed=True)
        build_wall = time.monotonic() - t0
        digest = hashlib.sha256(engine.serialize()).hexdigest()
        ctx = engine.create_execution_context()

        model.eval()
        correct_kiln = correct_torch = seen = 0
        max_abs = 0.0
        err2 = ref2 = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device).contiguous(), y.to(device)
                ref = model.module(x).float()
                got = ctx.run([x])["logits"].float()
                correct_kiln += int((got.argmax(1) == y).sum())
                correct_torch += int((ref.argmax(1) == y).sum())
                seen += len(y)
                max_abs = max(max_abs, float((got - ref).abs().max()))
                err2 += float(((got - ref) ** 2).sum())
                ref2 += float((ref ** 2).sum())
        stats = torch.tensor([correct_kiln, correct_torch, seen, err2, ref2], dtype=torch.float64,
                             device=device)
        dist.all_reduce(stats)
        peak = torch.tensor([max_abs], dtype=torch.float64, device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        digests = [None] * world
        dist.all_gather_object(digests, digest)
        report = engine.build_once_report
        builders = sorted(r["rank"] for r in report["ranks"] if r["role"] == "built")
        rel_l2 = (float(stats[3]) / max(float(stats[4]), 1e-30)) ** 0.5
        acc_kiln = float(stats[0] / stats[2])
        acc_torch = float(stats[1] / stats[2])
        rows.append({
            "epoch": epoch, "loss": loss_sum / max(steps, 1), "builds": len(builders),
            "builders": builders, "build_s": report["build_s"], "build_wall_s": build_wall,
            "digest": digest, "digests": digests, "identical": len(set(digests)) == 1,
            "engine_bytes": report["bytes"], "acc_kiln": acc_kiln, "acc_torch": acc_torch,
            "max_abs": float(peak[0]), "rel_l2": rel_l2,
            "ok": len(builders) == 1 and len(set(digests)) == 1 and rel_l2 < 2e-2,
        })
        del ctx, engine

    if rank == 0:
        print(f"{'epoch':>5} {'loss':>7} {'builds':>6} {'builder':>7} {'build s':>8} "
              f"{'engine sha256':>14} {'same on ranks':>13} {'acc kiln':>8} {'acc torch':>9} "
              f"{'max |d|':>9} {'rel L2':>9} {'ok':>3}")
        for r in rows:
            print(f"{r['epoch']:>5} {r['loss']:>7.4f} {r['builds']:>6} {str(r['builders']):>7} "
                  f"{r['build_s']:>8.3f} {r['digest'][:12]:>14} "
                  f"{('yes x%d' % world) if r['identical'] else 'NO':>13} {r['acc_kiln']:>8.3f} "
                  f"{r['acc_torch']:>9.3f} {r['max_abs']:>9.2e} {r['rel_l2']:>9.2e} "
                  f"{'yes' if r['ok'] else 'NO':>3}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "backend": backend, "epochs": rows}, f, indent=2)
    ok = all(r["ok"] for r in rows)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
