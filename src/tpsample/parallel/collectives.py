"""Every collective tpsample issues, in one place.

- At TP=1 each call returns its input (no torch.distributed call at all).
- Each call waits with the group's timeout; a timeout or a broken connection (a dead rank)
  raises `CollectiveError` naming the collective, the rank and the likely cause, so a run ends
  with a message instead of hanging.
- Each call adds its bytes sent/received (per rank, ring algorithms) to `CommStats`.
Works on gloo (CPU, and CUDA tensors) and NCCL.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .group import TPGroup


class CollectiveError(RuntimeError):
    """A collective failed or timed out: a peer rank died, hung or disagreed on shapes."""


@dataclass
class CommStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    num_collectives: int = 0

    def add(self, sent: int, received: int) -> None:
        self.bytes_sent += int(sent)
        self.bytes_received += int(received)
        self.num_collectives += 1


class Collectives:
    def __init__(self, group: TPGroup):
        self.group = group
        self.size = group.size             # ranks (1: every call returns its input)
        self.timeout = group.timeout       # per collective (a timedelta, made once)
        self.stats = CommStats()

    def _wait(self, work, name: str) -> None:
        try:
            ok = work.wait(timeout=self.timeout)
        except Exception as exc:  # gloo raises on a closed peer or on timeout
            raise CollectiveError(
                f"{name} failed on rank {self.group.rank}/{self.group.size} "
                f"(timeout {self.group.timeout_s:.0f}s): a peer rank probably died or hung: {exc}") from exc
        if ok is False:
            raise CollectiveError(f"{name} timed out on rank {self.group.rank} after {self.group.timeout_s:.0f}s")

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.size == 1:
            return t
        t = t.contiguous().clone()
        rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        self._wait(dist.all_reduce(t, op=rop, group=self.group.pg, async_op=True), f"all_reduce({op})")
        ring = 2 * t.numel() * t.element_size() * (self.size - 1) // self.size
        self.stats.add(ring, ring)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[*shape] on every rank -> [size, *shape] (rank order)."""
        if self.size == 1:
            return t.unsqueeze(0)
        t = t.contiguous()
        flat = t.reshape(-1)
        out = torch.empty((self.size * flat.numel(),), dtype=t.dtype, device=t.device)
        # torch >= 2.13 renames all_gather_into_tensor to all_gather_single
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._wait(gather(out, flat, group=self.group.pg, async_op=True), "all_gather")
        out = out.view(self.size, *t.shape)
        nbytes = t.numel() * t.element_size() * (self.size - 1)
        self.stats.add(nbytes, nbytes)
        return out

    def exchange_rows(self, x: torch.Tensor, row_splits: list[int], out: torch.Tensor,
                      col_ranges: list[tuple[int, int]]) -> torch.Tensor:
        """batch_sharded's all-to-all, received where the rows are sampled: x [sum(row_splits),
        cols] holds this rank's columns of every row, owner by owner (row_splits[d] rows for rank
        d); out [row_splits[me], V] gets each rank s's columns of this rank's rows at
        out[:, col_ranges[s]]. One grouped exchange of a message a row (each row's slice of out
        is contiguous), so nothing is padded, staged or concatenated; rows keep x's dtype."""
        me = self.group.rank
        starts = [0]
        for n in row_splits:
            starts.append(starts[-1] + n)
        s_me, e_me = col_ranges[me]
        out[:, s_me:e_me].copy_(x[starts[me]:starts[me + 1]])
        if self.size == 1:
            return out
        ops = []
        for peer in range(self.size):
            if peer == me:
                continue
            rank = self._global(peer)
            ops += [dist.P2POp(dist.isend, x[r], rank, self.group.pg) for r in range(starts[peer], starts[peer + 1])]
            s, e = col_ranges[peer]
            ops += [dist.P2POp(dist.irecv, out[r, s:e], rank, self.group.pg) for r in range(out.shape[0])]
        for work in dist.batch_isend_irecv(ops) if ops else ():
            self._wait(work, "exchange_rows")
        size = x.element_size()
        sent = (starts[-1] - row_splits[me]) * (e_me - s_me) * size
        received = out.shape[0] * (sum(e - s for s, e in col_ranges) - (e_me - s_me)) * size
        self.stats.add(sent, received)
        return out

    def _global(self, rank: int) -> int:
        """The global rank of this group's `rank` (what point-to-point calls name)."""
        return rank if self.group.pg is dist.group.WORLD else dist.get_global_rank(self.group.pg, rank)

    def broadcast_int(self, value: int, src: int = 0) -> int:
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        if self.group.backend == "nccl":
            t = t.cuda()
        self._wait(dist.broadcast(t, src=self._global(src),
                                  group=self.group.pg, async_op=True), "broadcast")
        return int(t.item())
