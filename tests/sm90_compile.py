"""Compile every kernel the sampling path launches for sm_90, on a machine without a GPU.

Run as a script (`python tests/sm90_compile.py GROUP`, TRITON_INTERPRET unset, in a process of
its own: it stubs torch.cuda and Triton's launch for good), it prints one JSON line per case of
GROUP (`CASES`): {"case", "kernels": [the kernels launched, in order], "error": None or
{"kernel", "message"}}.

How: the real entry points (`tpsample.kernels...`) run on fake CUDA tensors (torch's
FakeTensorMode; the device queries a launch makes answer as one H200, 132 SMs, stream 0), and
`JITFunction.run` is replaced by a recorder that binds and specialises the arguments exactly as
Triton's own `run` does (pointers 16-byte aligned, as fresh allocations are) and compiles the
launch for GPUTarget("cuda", 90, 32) through every stage of Triton's pipeline: its frontend
(types, shapes), its MLIR passes, LLVM's NVPTX backend and ptxas, which alone reads the kernels'
inline PTX. Triton's interpreter, which the other kernel tests run, checks none of this.
torch, Triton and tpsample are imported inside the functions: `triton.jit` picks interpreted or
compiled when a kernel module is imported, so none is imported before `main` unsets
TRITON_INTERPRET (and the test that imports `CASES` for its groups imports none).
"""
from __future__ import annotations

import functools
import json
import os
import sys
import types

ROWS, COLS = 64, 32_768       # small, but wide enough for the passes' real split geometry


def install_fakes():
    """Stub what a launch asks of CUDA and route every launch to `compile_launch`; returns the
    fake tensor mode the cases run in."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from triton.runtime.jit import JITFunction

    torch.cuda.get_device_properties = lambda i=0: types.SimpleNamespace(multi_processor_count=132)
    torch.cuda.current_device = lambda: 0
    torch._C._cuda_getCurrentRawStream = lambda i=0: 0
    torch._C._cuda_getDevice = lambda: 0
    FakeTensor.data_ptr = _fake_ptr
    FakeTensor.__getitem__ = _fake_getitem
    JITFunction.run = compile_launch
    return FakeTensorMode()


def _fake_ptr(t):
    return (1 << 30) + t.storage_offset() * t.element_size()


def _fake_getitem(t, key):
    """Basic indexing (ints, unit-step slices) as views: FakeTensor's own needs a real device."""
    out, dim = t, 0
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, slice) and k.step in (None, 1):
            start, stop, _ = k.indices(out.shape[dim])
            out, dim = out.narrow(dim, start, max(0, stop - start)), dim + 1
        elif isinstance(k, int):
            out = out.select(dim, k)
        else:
            raise NotImplementedError(f"index {key!r}")
    return out


class _Ptr:
    """What Triton's specialisation reads of a tensor argument."""

    def __init__(self, t):
        self.dtype, self._p = t.dtype, _fake_ptr(t)

    def data_ptr(self):
        return self._p


class KernelFailed(Exception):
    def __init__(self, kernel: str, message: str):
        super().__init__(f"{kernel}: {message}")
        self.kernel, self.message = kernel, message


LAUNCHED: list = []
_DONE: set = set()


def compile_launch(self, *args, grid, warmup, **kwargs):
    """`JITFunction.run`'s binding and specialisation (as Triton 3.9 does them), then the compile
    (once per specialisation); launches nothing."""
    import torch
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    name = self.fn.__name__
    LAUNCHED.append(name)
    kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug
    for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):     # those this Triton has
        if hasattr(knobs.compilation, knob):
            kwargs[knob] = getattr(knobs.compilation, knob)
    args = [_Ptr(a) if isinstance(a, torch.Tensor) else a for a in args]
    kw = {k: _Ptr(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    bound, specialization, options = create_function_from_signature(self.signature, self.params, _backend())(
        *args, **kw)
    options, signature, constexprs, attrs = self._pack_args(_backend(), kw, bound, specialization, options)
    key = repr((name, signature, constexprs, attrs, sorted(options.__dict__.items())))
    if key not in _DONE:
        try:
            _compile(self, signature, constexprs, attrs, options)
        except Exception as exc:
            raise KernelFailed(name, _last_lines(exc)) from exc
        _DONE.add(key)


def _last_lines(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " | ".join(line.strip() for line in text.splitlines()[-6:] if line.strip())[-600:]


@functools.cache
def _backend():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    return make_backend(GPUTarget("cuda", 90, 32))


def _compile(fn, signature, constexprs, attrs, options):
    """triton.compiler.compile's pipeline, without its cache (nothing is kept on disk)."""
    from triton._C.libtriton import ir
    from triton.compiler import ASTSource

    backend = _backend()
    src = ASTSource(fn, signature, constexprs, attrs)
    options = backend.parse_options(dict(options.__dict__, **src.parse_options()))
    stages: dict = {}
    backend.add_stages(stages, options, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(backend.target, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    metadata = {"hash": "sm90", "target": backend.target, **options.__dict__}
    names = list(stages)
    for ext in names[names.index(src.ext):]:
        module = stages[ext](module, metadata)


# ---- the cases: name -> a call of an entry point (built and run inside the fake tensor mode) --

def _e(*shape, dtype=None):
    """An uninitialised fake CUDA tensor (fp32 unless `dtype`)."""
    import torch
    return torch.empty(*shape, dtype=dtype or torch.float32, device="cuda")


def _rows_call(hints, dtype=None, **kw):
    """`sample_rows` on [ROWS, COLS] logits with `hints` (which passes, which constexprs)."""
    import torch

    from tpsample.kernels.sample import sample_rows
    params = (_e(ROWS), _e(ROWS, dtype=torch.int32), _e(ROWS), _e(ROWS), _e(ROWS, dtype=torch.int64),
              _e(ROWS, dtype=torch.int64))
    return lambda: sample_rows(_e(ROWS, COLS, dtype=dtype), *params, hints=hints, nans_out="partials", **kw)


def _top_values_call(c: int, with_t: bool):
    from tpsample.kernels import shard
    return lambda: shard.top_values(_e(ROWS, COLS // 2), c, _e(ROWS) if with_t else None)


def sample_rows_cases() -> dict:
    """sample_rows with each feature that changes its kernels' constexprs."""
    import torch

    from tpsample.kernels.sample import Kept, RowHints

    def hints(filt=False, kp=False, greedy=False, plain=False, p_alone=False):
        return RowHints(any_filter=filt, any_top_k_or_p=kp, any_greedy=greedy, any_plain=plain,
                        any_top_p_alone=p_alone)

    every, i64 = RowHints(), torch.int64
    return {
        "sample_rows greedy": _rows_call(hints(greedy=True)),
        "sample_rows plain": _rows_call(hints(plain=True)),
        "sample_rows top-k": _rows_call(hints(filt=True, kp=True)),
        "sample_rows top-p": _rows_call(hints(filt=True, kp=True, p_alone=True)),
        "sample_rows top-k+top-p": _rows_call(every),
        "sample_rows min-p": _rows_call(hints(filt=True, plain=True)),
        "sample_rows top-n-sigma": _rows_call(every, n_sigma=_e(ROWS)),
        "sample_rows kept": _rows_call(every, kept=Kept(_e(ROWS, dtype=i64))),
        "sample_rows kept+xtc": _rows_call(every, n_sigma=_e(ROWS),
                                           kept=Kept(_e(ROWS, dtype=i64), _e(ROWS), _e(ROWS, dtype=torch.bool))),
    }


def heavy_cases() -> dict:
    """The variants that take longest to compile: the sorts of c = 1000 and 2048 values, and
    every sample_rows pass again on bf16 logits."""
    import torch

    from tpsample.kernels.sample import RowHints
    return {"sample_rows bf16": _rows_call(RowHints(), torch.bfloat16),
            **{f"shard top_values c{c}{' T' * t}": _top_values_call(c, t) for c in (1000, 2048) for t in (False, True)}}


def shard_stats_steps_cases() -> dict:
    """The shard passes, the logprob statistics, the per-step ops and the penalties."""
    import torch

    from tpsample.kernels import penalties, shard, shard_band, stats, step_ops
    from tpsample.kernels.sample import shard_gumbel_argmax
    from tpsample.state.columns import Layout

    e, i32, i64, bf16 = _e, torch.int32, torch.int64, torch.bfloat16
    r, v, half = ROWS, COLS, COLS // 2
    cols = Layout.of(()).columns
    prepare_cols = {"T": cols["temperature"], "TOP_P": cols["top_p"], "MIN_P": cols["min_p"], "SEED": cols["seed"],
                    "TOP_K": cols["top_k"], "PROMPT_LEN": cols["prompt_len"]}
    lp_cols = {"NUM_LP": cols["num_logprobs"], "PROCESSED": cols["processed"]}
    pen_cols = (cols["temperature"], cols["top_p"], cols["min_p"])
    keys = (e(r, dtype=i64), e(r, dtype=i64))
    return {
        "logprob_stats raw": lambda: stats.logprob_stats(e(r, v), n=5),
        "logprob_stats T": lambda: stats.logprob_stats(e(r, v), temperature=e(r), threshold=e(r), n=5),
        "token_logprob_stats": lambda: stats.token_logprob_stats(e(r, v), e(r), 5),
        "raw_logprobs T": lambda: stats.raw_logprobs(
            e(r, 5, dtype=i64)[:, 0], e(r, v), 0, e(r), e(r, 5), e(r, 5, dtype=i64), e(r, dtype=i64),
            e(8, 512, dtype=i64), e(r, dtype=i64), lp_cols, 6, temperature=e(r)),
        "shard front": lambda: shard.front(e(r, half, dtype=bf16), half),
        "shard front copy": lambda: shard.front(e(r, half, dtype=bf16), half, e(r, half)),
        **{f"shard top_values c{c}{' T' * t}": _top_values_call(c, t) for c in (20, 51) for t in (False, True)},
        "shard tie_counts": lambda: shard.tie_counts(e(r, half), e(r), 20),
        "shard tie_counts T": lambda: shard.tie_counts(e(r, half), e(r), 20, e(r)),
        "shard gumbel_draw": lambda: shard.gumbel_draw(e(r, half), e(r), *keys, half),
        "shard gumbel_draw T": lambda: shard_gumbel_argmax(e(r, half), e(r), e(r), *keys, col_offset=half),
        "band_histogram": lambda: shard_band.band_histogram(e(r, half), e(16, dtype=i64), 512, 8.0),
        "band_partials": lambda: shard_band.band_partials(
            e(r, half), e(16, dtype=i64), e(16), e(16), e(16), e(16), e(16), e(16, dtype=i64), e(16, dtype=i64),
            half, 44, 16),
        "row_keys": lambda: step_ops.row_keys(*keys, 0x1234),
        "prepare_rows": lambda: step_ops.prepare_rows(e(6, 512), e(8, 512, dtype=i64), e(512, dtype=i64), *keys,
                                                      0x1234, prepare_cols),
        "mask_nans_": lambda: step_ops.mask_nans_(e(r, v)),
        "apply_penalties_ sorted": lambda: penalties.apply_penalties_(
            e(r, v), 0, *keys, e(r, 64, dtype=i64), e(512, 128, dtype=i32), 100, e(6, 512), pen_cols),
        "apply_penalties_ ordered": lambda: penalties.apply_penalties_(
            e(r, v), 0, *keys, e(512, 257, dtype=i32), None, 0, e(6, 512), pen_cols, e(512, dtype=i64)),
        "append_history": lambda: step_ops.append_history(
            e(512, 257, dtype=i32), e(512, 257, dtype=i32), e(512, dtype=i64), e(r, dtype=i64), e(r, 1, dtype=i64),
            e(r, dtype=i64)),
    }


# The cases in groups, so that a test runs a few at once (HEAVY: the slowest to compile).
CASES = {"sample_rows": sample_rows_cases, "shard_stats_steps": shard_stats_steps_cases, "heavy": heavy_cases}
GROUPS, HEAVY = tuple(CASES), "heavy"


def run_case(name: str, call, mode) -> dict:
    LAUNCHED.clear()
    error = None
    try:
        with mode:
            call()
    except KernelFailed as exc:
        error = {"kernel": exc.kernel, "message": exc.message}
    except Exception as exc:            # the launch code itself failed (not a compile)
        error = {"kernel": None, "message": f"{type(exc).__name__}: {_last_lines(exc)}"}
    return {"case": name, "kernels": list(LAUNCHED), "error": error}


def main(group: str) -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    mode = install_fakes()
    with mode:           # the cases' tensors are fake too
        table = CASES[group]()
    for name, call in table.items():
        print(json.dumps(run_case(name, call, mode)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
