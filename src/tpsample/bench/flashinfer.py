"""FlashInfer as the anchor of `bench sampler --compare`: its calls as vLLM makes them
(`recipe`), and whether its JIT modules build here (`build`).

FlashInfer compiles a module on first use; each module this bench calls is built in a child
process with a time limit (its process group, nvcc included, is killed when it runs out), so
the measured process only loads from FlashInfer's cache. `python -m tpsample.bench.flashinfer
--timeout S --out PATH` builds them ahead and writes the status that `bench sampler --compare
--flashinfer-status PATH` reads (`load_status`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch

MODULES = {           # name -> the call that builds (or loads) it
    "sampling": "from flashinfer.sampling import get_sampling_module; get_sampling_module()",
    "topk": "from flashinfer.topk import get_topk_module; get_topk_module()",
}
NO_PENALTIES = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
KNOWN = {"temperature", "top_k", "top_p", "min_p", "logprobs", "repetition_penalty", "frequency_penalty",
         "presence_penalty"}


def version() -> str | None:
    import importlib.metadata
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _use_build_env() -> dict:
    """FlashInfer compiles for this GPU alone, with every core, unless told otherwise; set here
    for this process too, so that the modules it loads later are the ones built (a module built
    for other architectures would be rebuilt on first use)."""
    if torch.cuda.is_available() and "FLASHINFER_CUDA_ARCH_LIST" not in os.environ:
        major, minor = torch.cuda.get_device_capability()
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = f"{major}.{minor}{'a' if major >= 9 else ''}"
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    return {k: os.environ[k] for k in ("FLASHINFER_CUDA_ARCH_LIST", "MAX_JOBS", "FLASHINFER_WORKSPACE_BASE")
            if k in os.environ}


def _build_one(code: str, timeout_s: float) -> dict:
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        out, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)          # the compilers it started too
        child.communicate()
        return {"ok": False, "why": f"not built within {timeout_s:.0f} s (killed)", "seconds": round(timeout_s)}
    seconds = round(time.perf_counter() - t0, 1)
    if child.returncode != 0:
        tail = " | ".join(line for line in out.strip().splitlines()[-3:])
        return {"ok": False, "why": f"build failed (exit {child.returncode}): {tail}"[:400], "seconds": seconds}
    return {"ok": True, "seconds": seconds}


def build(timeout_s: float) -> dict:
    """{"version", "env", "modules": {name: {"ok", "seconds"?, "why"?}}}: the modules built in
    turn within timeout_s seconds all together. Nothing is built without CUDA or FlashInfer, or
    with timeout_s <= 0 (the status says so)."""
    status = {"version": version(), "env": {}, "modules": {}}
    if not torch.cuda.is_available():
        why = "needs CUDA"
    elif status["version"] is None:
        why = "FlashInfer is not installed"
    elif timeout_s <= 0:
        why = "not asked for (--flashinfer-build-s 0)"
    else:
        why, status["env"] = None, _use_build_env()
    deadline = time.perf_counter() + timeout_s
    for name, code in MODULES.items():
        left = deadline - time.perf_counter()
        if why is not None:
            status["modules"][name] = {"ok": False, "why": why}
        elif name != "sampling" and not status["modules"]["sampling"]["ok"]:
            status["modules"][name] = {"ok": False, "why": "the sampling module did not build"}
        elif left < 1:
            status["modules"][name] = {"ok": False, "why": f"no time left of the {timeout_s:.0f} s to build it"}
        else:
            status["modules"][name] = _build_one(code, left)
    return status


def load_status(path: str) -> dict:
    """A status `build` wrote earlier (`python -m tpsample.bench.flashinfer --out PATH`): its
    modules load from FlashInfer's cache, those it did not build are not tried again (none is,
    when the file cannot be read)."""
    import json
    try:
        with open(path) as f:
            status = json.load(f)
    except (OSError, ValueError) as e:
        why = f"no usable build status in {path} ({type(e).__name__})"
        return {"version": version(), "env": {}, "modules": {name: {"ok": False, "why": why} for name in MODULES}}
    os.environ.update(status.get("env", {}))
    return status


def supported(params: dict) -> bool:
    """FlashInfer (with torch for penalties and logprobs) has the op: sampled rows (T > 0), no
    parameter it lacks, and min-p only alone."""
    if params.get("temperature", 1.0) == 0.0 or set(params) - KNOWN:
        return False
    return not (params.get("min_p") and (params.get("top_k") or params.get("top_p")))


def _penalties(x, prompt, output, rep, freq, pres) -> None:
    """vLLM v1's `apply_penalties` in torch: bin counts of the prompt and output tokens (padding
    id V), repetition on every seen token, frequency times the output count, presence on every
    output token; in place."""
    rows, vocab = x.shape
    prompt_seen = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=x.device).scatter_(1, prompt, True)[:, :vocab]
    counts = torch.zeros(rows, vocab + 1, dtype=torch.int64, device=x.device)
    counts = counts.scatter_add_(1, output, torch.ones_like(output))[:, :vocab]
    seen = prompt_seen | (counts > 0)
    scale = torch.where(seen, rep[:, None], 1.0)
    x.copy_(torch.where(x > 0, x / scale, x * scale))
    x.sub_(freq[:, None] * counts)
    x.sub_(pres[:, None] * (counts > 0))


def _logprobs(raw: torch.Tensor, tokens: torch.Tensor, n: int):
    """Top-n raw logprobs, the sampled token's logprob and its rank (vLLM's gather_logprobs)."""
    top_lp, top_ids = raw.topk(n, dim=1)
    tok_lp = raw.gather(1, tokens[:, None])
    ranks = (raw > tok_lp).sum(dim=1, keepdim=True) + 1
    return torch.cat([tokens[:, None], top_ids, ranks], dim=1), torch.cat([tok_lp, top_lp], dim=1)


def recipe(params: dict, x: torch.Tensor, top_k_max: int | None = None, histories=None):
    """call() -> finish(): the FlashInfer call for `params` on the logits x (modified in place:
    refill x before each call); None when `supported(params)` is False. histories: (prompt
    [R, P], output [R, O]) int64 token ids for the penalties."""
    if not supported(params):
        return None
    import flashinfer.sampling as fs

    rows, dev, p = x.shape[0], x.device, params

    def full(v, dtype):
        return torch.full((rows,), v, dtype=dtype, device=dev)

    t = full(p["temperature"], torch.float32)
    seeds = {"seed": torch.arange(rows, dtype=torch.int64, device=dev), "offset": full(0, torch.int64)}
    k, top_p = full(p.get("top_k", 0), torch.int32), full(p.get("top_p", 1.0), torch.float32)
    min_p = full(p.get("min_p", 0.0), torch.float32)
    pen = {name: p.get(name, default) for name, default in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0),
                                                             ("presence_penalty", 0.0))}
    penalties = [full(v, torch.float32) for v in pen.values()] if pen != NO_PENALTIES else None
    fast = {"top_k_max": top_k_max} if top_k_max else {}

    def draw():
        if p.get("top_k") and (p.get("top_p") or fast):
            return fs.top_k_top_p_sampling_from_logits(x, k, top_p, deterministic=True, **fast, **seeds)
        if p.get("top_p"):
            return fs.top_p_sampling_from_probs(x.softmax(dim=-1), top_p, deterministic=True, **seeds)
        if p.get("top_k"):
            return fs.top_k_sampling_from_probs(x.softmax(dim=-1), k, deterministic=True, **seeds)
        if p.get("min_p"):
            return fs.min_p_sampling_from_probs(x.softmax(dim=-1), min_p, deterministic=True, **seeds)
        return fs.sampling_from_logits(x, deterministic=True, **seeds)

    def call():
        raw = x.log_softmax(dim=-1) if p.get("logprobs") else None
        if penalties is not None:
            _penalties(x, *histories, *penalties)
        x.div_(t[:, None])
        tokens = draw()
        if raw is None:
            return tokens.tolist
        ids, lps = _logprobs(raw, tokens.long(), p["logprobs"])
        return lambda: (ids.tolist(), lps.tolist())
    return call


def main(argv=None) -> int:
    """`python -m tpsample.bench.flashinfer [--timeout S] [--out PATH]`: build, print the status."""
    import argparse
    import json
    p = argparse.ArgumentParser(prog="python -m tpsample.bench.flashinfer",
                                description="Build FlashInfer's JIT modules that bench sampler --compare calls.")
    p.add_argument("--timeout", metavar="S", type=float, default=240.0, help="seconds for all modules (default 240)")
    p.add_argument("--out", metavar="PATH", default=None, help="also write the status there (default: none)")
    args = p.parse_args(argv)
    status = build(args.timeout)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(status, f, indent=1)
    print(json.dumps(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
