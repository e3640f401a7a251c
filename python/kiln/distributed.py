"""Build once per job (or per node, or per architecture) over the job's own torch.distributed
process group (gloo or NCCL).

The lowest rank of each group builds (or reads the shared engine cache); the others wait (bounded)
and receive the engine bytes through the process group; every rank checks the bytes' checksum and
loads them. The election, the groups, the bounds, the checks and the report are the library's (the
path `kiln build --distributed` takes); this module only moves bytes through torch.distributed and
makes sub-groups when the library asks.
"""
from __future__ import annotations

import ctypes
import datetime
import json
import re
from typing import Any, Optional

from . import _lib
from ._lib import lib

__all__ = ["build", "refit"]


def build(model, example_inputs=None, *, group=None, build_on: str = "rank0",
          cache_dir=None, trust_shared_cache: bool = False, join_timeout: float = 60.0,
          wait_timeout: float = 1800.0, transfer_timeout: float = 300.0,
          heartbeat_timeout: float = 60.0, **options):
    """kiln.build(..., distributed=group): one build per job (or per node, or per architecture),
    the same engine on every rank of a group.

    Every rank of `group` (the default process group when None) calls this with the same model
    and options. build_on: "rank0" (one builder for the job), "per-node" (one per node: the
    KILN_DIST_NODE variable, else the host name) or "per-arch" (one per device architecture), as
    `kiln build --build-on`; per-node and per-arch need the job's whole process group (its
    sub-groups are made with torch.distributed.new_group, which every rank of the job must call;
    another group that would split is KILN-E7027). cache_dir: the shared engine cache the builders
    go through (a hit is read, not built; builders of several nodes or jobs build once between
    them); trust_shared_cache accepts a directory other users can write. join_timeout bounds the
    ranks' arrival, wait_timeout the wait for the builder, transfer_timeout the bytes; the builder
    sends its progress about every second and a builder silent for heartbeat_timeout (0: no
    heartbeats) fails the others (KILN-E7003). Waiting ranks see the builder's progress through
    `progress` as phase "builder" (the line as detail). A builder that fails or vanishes fails
    every rank with a KilnError. The engine's `build_once_report` says who built and who waited
    how long.
    """
    from . import build as _build
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        from . import _error
        raise _error(7000, "kiln.distributed.build needs an initialised torch.distributed process "
                     "group (torch.distributed.init_process_group)")
    return _build(model, example_inputs, distributed=group if group is not None else True,
                  build_on=build_on, cache_dir=cache_dir, trust_shared_cache=trust_shared_cache,
                  join_timeout=join_timeout, wait_timeout=wait_timeout,
                  transfer_timeout=transfer_timeout, heartbeat_timeout=heartbeat_timeout,
                  **options)


def refit(engine, weights=None, *, group=None, timeout: float = 300.0):
    """New weights into the engine every rank of `group` holds (the one kiln.distributed.build gave
    them), between runs, sending only what changed.

    Every rank of `group` (the default process group when None) calls this with its engine and,
    when it holds them, the new weights (as Engine.refit takes them: an ONNX path, bytes or
    ModelProto, or a mapping from initializer name to tensor such as a state_dict); ranks without
    them pass None. When every rank holds the weights, each refits locally and nothing is sent.
    Otherwise the lowest rank that holds them checks and replays the refit and broadcasts only the
    engine constants whose bytes changed; the others take those. Ranks that pass weights must pass
    the same ones, and every rank must run the same weights before (KILN-E7028 names the ranks).
    Wrong weights raise the refit's error (KILN-E4008, ...) on every rank and change no engine.
    `timeout` bounds each exchange. Returns the report: mode ("local" or "relay"), source,
    holders, constants_sent, constants_unchanged, bytes_sent, generation, and the refit's report
    where this rank computed it."""
    import os
    import torch.distributed as dist
    from . import KilnError, _error, _raise_status, _refit_weights
    if not dist.is_available() or not dist.is_initialized():
        raise _error(7000, "kiln.distributed.refit needs an initialised torch.distributed "
                     "process group (torch.distributed.init_process_group)")
    keep = None
    w = None
    if weights is not None:
        if isinstance(weights, (str, os.PathLike)):
            with open(weights, "rb") as f:
                weights = f.read()
        w, keep = _refit_weights(weights, "an onnx.ModelProto, a mapping from initializer name "
                                 "to tensor, or None on ranks without the new weights")
    comm = _GroupComm(group)
    report = ctypes.c_void_p()
    status = lib.kiln_engine_refit_group(engine._h, ctypes.byref(w) if w is not None else None,
                                         ctypes.byref(comm.struct), float(timeout),
                                         ctypes.byref(report))
    try:
        _raise_status(status)
    except KilnError as e:
        if comm.errors:
            e.message += f" (process group: {comm.errors[-1]})"
            e.args = (f"{e.code} {e.name}: {e.message}\n  remedy: {e.remedy}",)
        raise
    del keep
    return json.loads(_lib.take_buffer(report))


class _GroupComm:
    """The process group as kiln_comm callbacks (0 ok, 1 timed out, 2 failed)."""

    def __init__(self, group, errors=None):
        import torch
        import torch.distributed as dist
        self.torch = torch
        self.dist = dist
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        backend = str(dist.get_backend(self.group)).lower()
        self.device = (torch.device("cuda", torch.cuda.current_device()) if backend == "nccl"
                       else torch.device("cpu"))
        self.errors = errors if errors is not None else []
        self.children = []  # sub-groups made by split, released after the build
        self.collectives = 0
        self.struct = _lib.Comm()
        self.struct.rank = self.rank
        self.struct.size = self.size
        self._allgather = _lib.ALLGATHER_FN(self.allgather)
        self._broadcast = _lib.BROADCAST_FN(self.broadcast)
        # torch.distributed.new_group needs every rank of the job: only a group of all of them
        # can split (kiln answers KILN-E7027 for another one that would have to).
        self._split = (_lib.SPLIT_FN(self.split) if self.size == dist.get_world_size()
                       else _lib.SPLIT_FN())
        self.struct.allgather = self._allgather
        self.struct.broadcast = self._broadcast
        self.struct.split = self._split

    def _global(self, group_rank: int) -> int:
        if self.group is self.dist.group.WORLD:
            return group_rank
        get = getattr(self.dist, "get_global_rank", None) or \
            self.dist.distributed_c10d._get_global_rank
        return get(self.group, group_rank)

    def _tensor(self, address: int, size: int):
        """A uint8 tensor over `size` bytes at `address` (a copy on the NCCL device)."""
        torch = self.torch
        t = torch.empty(size, dtype=torch.uint8)
        if size:
            ctypes.memmove(t.data_ptr(), address, size)
        return t.to(self.device)

    def _wait(self, work, timeout_s: float) -> int:
        ok = work.wait(timeout=datetime.timedelta(seconds=max(timeout_s, 0.001)))
        return 0 if ok is None or ok else 1

    def _fail(self, e: BaseException) -> int:
        text = f"{type(e).__name__}: {e}"
        self.errors.append(text)
        lowered = text.lower()
        return 1 if ("timed out" in lowered or "timeout" in lowered) else 2

    def allgather(self, _user, mine, size, out, timeout_s) -> int:
        try:
            self.collectives += 1
            t = self._tensor(mine, size)
            parts = [self.torch.empty_like(t) for _ in range(self.size)]
            rc = self._wait(self.dist.all_gather(parts, t, group=self.group, async_op=True),
                            timeout_s)
            if rc:
                return rc
            for i, p in enumerate(parts):
                if size:
                    p = p.cpu()
                    ctypes.memmove(out + i * size, p.data_ptr(), size)
            return 0
        except BaseException as e:  # noqa: B902 (reported through the status, never lost)
            return self._fail(e)

    def broadcast(self, _user, data, size, root, timeout_s) -> int:
        try:
            self.collectives += 1
            t = self._tensor(data, size)
            work = self.dist.broadcast(t, src=self._global(root), group=self.group, async_op=True)
            rc = self._wait(work, timeout_s)
            if rc:
                return rc
            if size and self.rank != root:
                t = t.cpu()
                ctypes.memmove(data, t.data_ptr(), size)
            return 0
        except BaseException as e:  # noqa: B902
            return self._fail(e)


    def split(self, _user, color, key, out, timeout_s) -> int:
        """Sub-groups by color (kiln_comm.split): every rank makes every group, in one order, as
        torch.distributed.new_group asks; a group's ranks are ordered by their rank in the job
        (kiln passes the job rank as the key)."""
        try:
            self.collectives += 1
            torch, dist = self.torch, self.dist
            mine = torch.tensor([color, key, self._global(self.rank)], dtype=torch.int64,
                                device=self.device)
            parts = [torch.empty_like(mine) for _ in range(self.size)]
            rc = self._wait(dist.all_gather(parts, mine, group=self.group, async_op=True),
                            timeout_s)
            if rc:
                return rc
            rows = sorted(tuple(int(v) for v in p.cpu().tolist()) for p in parts)
            timeout = datetime.timedelta(seconds=max(timeout_s, 1.0))
            chosen = None
            for c in sorted({r[0] for r in rows}):
                members = sorted(r[2] for r in rows if r[0] == c)
                made = dist.new_group(ranks=members, timeout=timeout)
                if c == color:
                    chosen = made
            child = _GroupComm(chosen, self.errors)
            child._split = _lib.SPLIT_FN()  # one level of groups is all build-once makes
            child.struct.split = child._split
            self.children.append(child)
            dst = out.contents
            dst.user = None
            dst.rank = child.rank
            dst.size = child.size
            dst.allgather = child._allgather
            dst.broadcast = child._broadcast
            dst.split = child._split
            return 0
        except BaseException as e:  # noqa: B902
            return self._fail(e)

    def release(self) -> None:
        """Drops the sub-groups split made (each rank its own)."""
        for child in self.children:
            try:
                self.dist.destroy_process_group(child.group)
            except Exception:  # noqa: BLE001 (a broken group may refuse; it is dropped anyway)
                pass
        self.children = []


def _build_once(config, data: bytes, name: str, group, build_on: str = "rank0", cache_dir=None,
                trust_shared_cache: bool = False, join_timeout: float = 60.0,
                wait_timeout: float = 1800.0, transfer_timeout: float = 300.0,
                heartbeat_timeout: float = 60.0):
    import os
    from . import Engine, KilnError, _raise_status
    comm = _GroupComm(group)
    opts = _lib.BuildOnceOptions()
    opts.join_timeout_s = float(join_timeout)
    opts.wait_timeout_s = float(wait_timeout)
    opts.transfer_timeout_s = float(transfer_timeout)
    opts.heartbeat_timeout_s = float(heartbeat_timeout)
    opts.build_on = str(build_on).encode()
    opts.cache_dir = os.fsencode(cache_dir) if cache_dir is not None else None
    opts.trust_shared_cache = 1 if trust_shared_cache else 0
    h = ctypes.c_void_p()
    report = ctypes.c_void_p()
    try:
        status = lib.kiln_build_once(config._h, data, len(data), name.encode(),
                                     ctypes.byref(comm.struct), ctypes.byref(opts),
                                     ctypes.byref(h), ctypes.byref(report))
    finally:
        comm.release()
    if config.error is not None:
        if status:
            lib.kiln_status_free(status)
        raise config.error
    try:
        _raise_status(status)
    except KilnError as e:
        # Every rank can tell what failed the job: the builder's own code rides along on E7011.
        found = re.search(r"KILN-E\d+", e.message) if e.number == 7011 else None
        e.builder_code = found.group(0) if found else e.code
        if comm.errors:
            e.message += f" (process group: {comm.errors[-1]})"
            e.args = (f"{e.code} {e.name}: {e.message}\n  remedy: {e.remedy}",)
        raise
    engine = Engine(h.value)
    engine.build_once_report = json.loads(_lib.take_buffer(report))
    return engine
