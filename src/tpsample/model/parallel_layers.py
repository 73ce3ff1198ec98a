"""Tensor-parallel building blocks: the only place the model knows it is sharded.

`TPGroup` wraps the explicit torch.distributed ProcessGroup the model talks through (never the
implicit world group) and short-circuits every collective at size 1. Each layer owns its shard
of the weight, knows how to read that shard from a checkpoint slice (`weight_loader(param, slice
[, part])`, the slice indexable and carrying the checkpoint tensor's `name`, which its errors
give), and runs its own collective in its own `forward`:

- `MergedColumnParallelLinear`: several column-parallel layers as one GEMM (q|k|v, gate|up);
  each part's output features split in units (heads, or 1) on its own, so no collective. Units
  that do not divide by TP but divide TP (few KV heads, many ranks) are replicated.
- `RowParallelLinear`: input features split; one all-reduce, bias added once after it.
- `VocabParallelEmbedding`: rows [start, end) of `tpsample.vocab_shard`; one all-reduce.
- `ParallelLMHead`: the same vocab split; returns this rank's `[rows, V_r]` logits and never
  gathers them (the sampler decides what crosses ranks).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tpsample.parallel.group import TPGroup  # noqa: F401  (the one TP group type; re-exported)


def shard_range(num_units: int, tp_size: int, rank: int) -> tuple[int, int]:
    """This rank's [start, end) in units; units replicate when there are fewer units than ranks."""
    if num_units % tp_size == 0:
        per = num_units // tp_size
        return rank * per, (rank + 1) * per
    if tp_size % num_units == 0:
        unit = rank // (tp_size // num_units)
        return unit, unit + 1
    raise ValueError(f"{num_units} heads/features cannot be split over tensor_parallel_size={tp_size}")


def vocab_range(vocab_size: int, group: TPGroup) -> tuple[int, int]:
    """The vocabulary columns this rank holds: exactly the sampler's split."""
    from ..parallel.shard import vocab_shard  # one split for the whole library: the sampler's

    return vocab_shard(vocab_size, group.size, group.rank)


def _empty(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def _copy_checked(param: torch.Tensor, checkpoint_slice, index) -> None:
    """param <- checkpoint_slice[index]; a shape mismatch names the checkpoint tensor."""
    loaded = checkpoint_slice[index]
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(f"checkpoint tensor {checkpoint_slice.name}: this rank's slice is {list(loaded.shape)}, "
                         f"its parameter shard {list(param.shape)}")
    param.data.copy_(loaded)


class MergedColumnParallelLinear(nn.Module):
    """[x @ W_0_local.T | x @ W_1_local.T | ...] in one GEMM, each part's rows sharded on its own.
    `split_sizes` are the parts' local widths; the loader fills part i with `weight_loader(param,
    checkpoint_slice, i)`."""

    def __init__(self, in_features: int, out_features: list[int], *, bias: bool, group: TPGroup, unit: int = 1):
        super().__init__()
        self.ranges = []
        for n in out_features:
            assert n % unit == 0
            start, end = shard_range(n // unit, group.size, group.rank)
            self.ranges.append((start * unit, end * unit))
        self.split_sizes = [end - start for start, end in self.ranges]
        self.offsets = [sum(self.split_sizes[:i]) for i in range(len(self.split_sizes))]
        self.weight = _empty(sum(self.split_sizes), in_features)
        self.weight.weight_loader, self.weight.num_parts = self._load_part, len(out_features)
        self.bias = _empty(sum(self.split_sizes)) if bias else None
        if self.bias is not None:
            self.bias.weight_loader, self.bias.num_parts = self._load_part, len(out_features)

    def _load_part(self, param: nn.Parameter, checkpoint_slice, part: int) -> None:
        (start, end), offset = self.ranges[part], self.offsets[part]
        _copy_checked(param.data[offset:offset + end - start], checkpoint_slice, slice(start, end))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local @ W[:, cols of this rank].T) + b; input arrives sharded."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, group: TPGroup,
                 unit: int = 1):
        super().__init__()
        assert in_features % unit == 0
        start, end = shard_range(in_features // unit, group.size, group.rank)
        if in_features // unit < group.size:
            raise ValueError(f"RowParallelLinear cannot replicate its input over {group.size} ranks")
        self.group = group
        self.in_start, self.in_end = start * unit, end * unit
        self.weight = _empty(out_features, self.in_end - self.in_start)
        self.weight.weight_loader = self._load_cols
        self.bias = _empty(out_features) if bias else None

    def _load_cols(self, param: nn.Parameter, checkpoint_slice) -> None:
        _copy_checked(param, checkpoint_slice, (slice(None), slice(self.in_start, self.in_end)))

    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce(F.linear(x_local, self.weight))
        return y if self.bias is None else y + self.bias


class _VocabShard(nn.Module):
    """A [V_r, dim] weight holding vocabulary rows [vocab_start, vocab_end) (the sampler's split)."""

    def __init__(self, vocab_size: int, dim: int, *, group: TPGroup):
        super().__init__()
        self.group = group
        self.vocab_start, self.vocab_end = vocab_range(vocab_size, group)
        self.weight = _empty(self.vocab_end - self.vocab_start, dim)
        self.weight.weight_loader = self._load_rows

    def _load_rows(self, param: nn.Parameter, checkpoint_slice) -> None:
        _copy_checked(param, checkpoint_slice, slice(self.vocab_start, self.vocab_end))


class VocabParallelEmbedding(_VocabShard):
    """Embedding rows [vocab_start, vocab_end); ids outside the shard contribute zeros."""

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        inside = (token_ids >= self.vocab_start) & (token_ids < self.vocab_end)
        local_ids = torch.where(inside, token_ids - self.vocab_start, 0)
        emb = F.embedding(local_ids, self.weight) * inside.unsqueeze(-1).to(self.weight.dtype)
        return self.group.all_reduce(emb)


class ParallelLMHead(_VocabShard):
    """Local logits [rows, V_r] for this rank's vocab shard; never gathered here."""

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        assert (embedding.vocab_start, embedding.vocab_end) == (self.vocab_start, self.vocab_end)
        self.weight = embedding.weight

    def forward(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_rows, self.weight)
