"""A decode step recorded once as its list of kernel launches, replayed over any logits buffer.

A CUDA graph (`capture.CapturedStep`) freezes the logits' address: an engine whose logits come
in a new allocation each step cannot replay it. `TapedStep` records the same step (`run_step`,
the same static buffers, guards and pinned results) as the list of its Triton launches with
their arguments, and replays it by issuing those launches again with the logits pointer
swapped for the new buffer's: no Python pipeline, no per-argument checks (pointers are passed
as integers), one launch per kernel, then the results' copy to the host and one event.

Contract:
- the same plans as `capture` (`check_capturable`); the new buffer must match the recorded one
  in shape, strides, dtype, device and 16-byte alignment (what the kernels were specialised on);
- a plan `capture` refuses raises its `ValueError` before any work. A step that does device
  work outside the recorded launches (a torch operation on a device tensor other than views
  and allocations: the tape could not repeat it), or whose launches are not all repeatable (a
  kernel compiled during the recording), is marked `refused` (the reason); the caller then
  samples the plan eagerly;
- the recording call is itself a step: `first` is its output (refused or not). Replays give
  the tokens and logprobs an eager call gives, bitwise (same kernels, same arguments);
- an output's device tensors are the step's static buffers, overwritten by the next replay.
Never imports `model` or `engine`.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .capture import ReplayGuard, check_capturable, reserve, step_context
from .kernels import launcher
from .parallel.registry import STRATEGIES
from .sampling.keys import append_kernel
from .sampling.output import ReplayResults, SamplerOutput
from .step import run_step

# aten operations that do no device work: views, metadata and allocation
_NO_WORK = frozenset({
    "empty", "empty_strided", "empty_like", "as_strided", "view", "_unsafe_view", "select", "slice", "reshape",
    "_reshape_alias", "detach", "alias", "unsqueeze", "squeeze", "t", "transpose", "expand", "permute", "unbind",
    "split", "split_with_sizes", "narrow", "unfold", "view_as_real", "view_as_complex", "lift_fresh", "set_",
    "is_pinned", "_pin_memory", "record_stream",
})


class DeviceWork(TorchDispatchMode):
    """Notes each aten operation that touches a tensor on `device_type` and is not a view,
    metadata query or allocation (`found`: their names)."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type = device_type
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in _NO_WORK and self._touches(args, kwargs, out):
            self.found.append(name)
        return out

    def _touches(self, args, kwargs, out) -> bool:
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}, out))
        return any(isinstance(a, torch.Tensor) and a.device.type == self.device_type for a in flat)


def _logits_view(arg, logits: torch.Tensor):
    """Byte offset of `arg` into `logits` when it is a view of its memory, else None."""
    if not isinstance(arg, torch.Tensor) or arg.device != logits.device:
        return None
    if arg.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr():
        return None
    return arg.data_ptr() - logits.data_ptr()


class _Entry:
    """One recorded launch: what it needs to be issued again over other logits."""

    def __init__(self, rec, logits: torch.Tensor):
        self.launcher, self.compiled, self.grid, self.args, self.constexprs = rec
        self.slots = []               # (argument position, byte offset, the recorded view)
        for i, a in enumerate(self.args):
            off = _logits_view(a, logits)
            if off is not None:
                if a.dtype != logits.dtype:
                    raise ValueError("a kernel of the step reads the logits under another dtype: not replayable")
                self.slots.append((i, off, a))
        c = self.compiled
        self.direct = c is not None and c.run is not None
        self.ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in self.args]

    def launch(self, logits: torch.Tensor, ptr: int, stream: int) -> None:
        if self.direct and launcher._no_hooks():
            ints = self.ints
            if self.slots:
                ints = list(ints)
                for i, off, _ in self.slots:
                    ints[i] = ptr + off
            c = self.compiled
            c.run(self.grid[0], self.grid[1], self.grid[2], stream, c.function, c.packed, None, None, None,
                  *ints, *c.rest)
            return
        args = list(self.args)
        for i, off, view in self.slots:
            args[i] = logits.as_strided(view.shape, view.stride(),
                                        logits.storage_offset() + off // logits.element_size())
        if self.compiled is not None:
            self.launcher._run(self.compiled, self.grid, tuple(args), self.constexprs)
        else:
            self.launcher.fn[self.grid](*args, **self.constexprs)


class TapedStep:
    """One plan's decode step as a list of launches, replayable over any matching logits buffer."""

    def __init__(self, sampler, plan, logits: torch.Tensor, reserve_tokens: int = 1024):
        check_capturable(sampler, plan)
        self.sampler, self.plan = sampler, plan
        self.key = _buffer_key(logits)
        store, dev = sampler.store, logits.device
        limit = reserve(sampler, plan, dev, reserve_tokens)
        slots_dev = plan.device_array("slots", plan.slots, dev)
        ctx = step_context(sampler)
        with store.history.full_width():
            warm = STRATEGIES[plan.strategy].sample(logits, plan, ctx)      # compiles kernels, fills caches
            self._results = ReplayResults(warm.block, plan.max_rows, warm.logprobs)
            check = DeviceWork(dev.type)
            with launcher.recording() as tape, check:
                res = run_step(logits, plan, ctx, slots_dev, append_kernel(dev))
        # the recording was this call's step (run in full, history appended): it is returned
        # whether or not the launches can be replayed
        self.refused = None
        if check.found:
            self.refused = f"device work outside the kernels ({', '.join(sorted(set(check.found)))})"
        elif not tape.complete or not tape.entries:
            self.refused = "a launch that cannot be repeated (a kernel compiled while recording)"
        else:
            try:
                self._entries = [_Entry(rec, logits) for rec in tape.entries]
            except ValueError as e:
                self.refused = str(e)
        if self.refused is not None:
            store.history.note_step(plan.slots, plan.rows_per_req)
            self.first = SamplerOutput(res.block, plan.max_rows, res.logprobs)
            return
        self._results.bind(res.block, res.logprobs)
        self._guard = ReplayGuard(store, plan, limit)
        self.first = self._finish()

    def matches(self, logits: torch.Tensor) -> bool:
        return _buffer_key(logits) == self.key

    def replay(self, logits: torch.Tensor) -> SamplerOutput:
        """Sample the step from `logits` (a buffer matching the recorded one, see `matches`)."""
        if self.refused is not None:
            raise ValueError(f"this step cannot be replayed from its launches: {self.refused}")
        if not self.matches(logits):
            raise ValueError("logits differ from the recorded step's in shape, strides, dtype, device or alignment")
        self._guard.check()
        self._results.release()
        ptr = logits.data_ptr()
        stream = torch._C._cuda_getCurrentRawStream(logits.device.index) if logits.is_cuda else 0
        for e in self._entries:
            e.launch(logits, ptr, stream)
        return self._finish()

    def _finish(self) -> SamplerOutput:
        self._results.fill()
        out = self._results.publish()
        self.sampler.store.history.note_step(self.plan.slots, self.plan.rows_per_req)   # after the launches
        return out


def _buffer_key(logits: torch.Tensor) -> tuple:
    return (logits.shape, logits.stride(), logits.dtype, logits.device, logits.data_ptr() & 15 == 0)
