"""TPGroup: the tensor-parallel group as an explicit object (never the implicit world group).

Wraps a torch.distributed ProcessGroup with its rank, size and a collective timeout. `None`
with no initialised default group means TP=1: every collective short-circuits.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TPGroup:
    pg: Optional[object]          # torch.distributed ProcessGroup, None at TP=1
    rank: int
    size: int
    timeout_s: float = DEFAULT_TIMEOUT_S

    @staticmethod
    def resolve(group=None, timeout_s: float = DEFAULT_TIMEOUT_S) -> "TPGroup":
        if isinstance(group, TPGroup):
            return group
        if group is None:
            if not (dist.is_available() and dist.is_initialized()):
                return TPGroup(None, 0, 1, timeout_s)
            group = dist.group.WORLD
        return TPGroup(group, dist.get_rank(group), dist.get_world_size(group), timeout_s)

    @staticmethod
    def of(pg=None, timeout_s: float = DEFAULT_TIMEOUT_S) -> "TPGroup":
        """Exactly this ProcessGroup (None: TP=1), never the implicit default group."""
        if pg is None:
            return TPGroup(None, 0, 1, timeout_s)
        return TPGroup(pg, dist.get_rank(pg), dist.get_world_size(pg), timeout_s)

    @property
    def group(self):
        """The torch.distributed ProcessGroup (None at TP=1)."""
        return self.pg

    def all_reduce(self, x, op=None):
        """In place on x, returned; a no-op at size 1 (the model layers' one collective)."""
        if self.size > 1:
            dist.all_reduce(x, op=dist.ReduceOp.SUM if op is None else op, group=self.pg)
        return x

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)

    @property
    def backend(self) -> str:
        return "none" if self.pg is None else str(dist.get_backend(self.pg))

    def cpu_twin(self) -> "TPGroup":
        """A group over the same ranks that carries CPU tensors (itself for gloo; a gloo group
        otherwise), for host-side agreement checks that must not synchronise the device.
        Collective: every rank of the group calls it."""
        if self.pg is None or self.backend == "gloo":
            return self
        ranks = dist.get_process_group_ranks(self.pg)
        return TPGroup(dist.new_group(ranks=ranks, backend="gloo"), self.rank, self.size, self.timeout_s)
