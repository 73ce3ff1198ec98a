"""Input checks for the Sampler facade: clear `ValueError`s before any collective or kernel runs."""
from __future__ import annotations

import numbers
import re
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from .coerce import is_bool, is_int
from .params import MAX_LOGPROBS

MAX_NUM_REQS = 1 << 24          # slot ids travel as int32 in places; 16M concurrent requests
MAX_TIMEOUT_S = 1e9             # seconds (~31 years): any finite wait a timedelta can hold


def is_token(t, vocab_size: int) -> bool:
    return is_int(t) and 0 <= t < vocab_size


def check_req_ids(req_ids) -> list[str]:
    if isinstance(req_ids, (str, bytes)) or not isinstance(req_ids, (list, tuple)):
        raise ValueError(f"req_ids must be a list of request ids, got {type(req_ids).__name__}")
    if len(set(req_ids)) != len(req_ids):
        raise ValueError("req_ids must be unique within a step")
    return list(req_ids)


def check_sampler_args(vocab_size, max_num_reqs, max_num_logits_per_req, max_logprobs, eos_token_id,
                       strategy, strategy_names, *, group=None, timeout_s=1.0, seed=None, flags=None,
                       group_types: tuple = ()) -> None:
    """The Sampler constructor's arguments (the device is `check_device`'s); ValueError naming the
    first bad one and its allowed range. flags: {name: value} of the True/False arguments.
    group_types: the group classes accepted besides a torch.distributed ProcessGroup."""
    if not is_int(vocab_size) or not 1 <= vocab_size < 2**31:
        raise ValueError(f"vocab_size must be an integer in [1, 2**31), got {vocab_size!r}")
    if strategy not in strategy_names:
        raise ValueError(f"strategy must be one of {strategy_names}, got {strategy!r}")
    if not is_int(max_num_logits_per_req) or not 1 <= max_num_logits_per_req <= 64:
        raise ValueError(f"max_num_logits_per_req must be an integer in [1, 64], got {max_num_logits_per_req!r}")
    if not is_int(max_logprobs) or not 0 <= max_logprobs <= MAX_LOGPROBS:
        raise ValueError(f"max_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {max_logprobs!r}")
    if not is_int(max_num_reqs) or not 1 <= max_num_reqs <= MAX_NUM_REQS:
        raise ValueError(f"max_num_reqs must be an integer in [1, {MAX_NUM_REQS}], got {max_num_reqs!r}")
    if eos_token_id is not None and not is_token(eos_token_id, vocab_size):
        raise ValueError(f"eos_token_id must be in [0, {vocab_size}), got {eos_token_id!r}")
    if seed is not None and not is_int(seed):
        raise ValueError(f"seed must be None or an integer (any size), got {seed!r}")
    if (not isinstance(timeout_s, numbers.Real) or is_bool(timeout_s)
            or not (0 < timeout_s <= MAX_TIMEOUT_S)):      # NaN fails the comparison too
        raise ValueError(f"timeout_s must be a number of seconds in (0, 1e9], got {timeout_s!r}")
    if group is not None and not isinstance(group, group_types) and not (
            dist.is_available() and isinstance(group, dist.ProcessGroup)):
        raise ValueError(f"group must be None, a torch.distributed ProcessGroup or a TPGroup, "
                         f"got {type(group).__name__}")
    for name, value in (flags or {}).items():
        if not is_bool(value):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def check_device(device, name: str = "device") -> Optional[torch.device]:
    """The sampler's device: None, or a CPU or CUDA device that exists here ("cpu", "cuda",
    "cuda:N" with N < torch.cuda.device_count(), a CUDA index N, or the torch.device of one).
    Other device types ("meta", "mps", ...) are refused: the sampler's tables and kernels are
    built and tested for CPU and CUDA only. The index is read before torch parses it (torch
    keeps device indices in 8 bits: "cuda:4096" would become cuda:0). name: the argument (or
    command-line option) the message names."""
    if device is None:
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    allowed = (f"None, 'cpu', 'cuda' or 'cuda:N' with N < {count} (the CUDA devices here)" if count
               else "None or 'cpu' (no CUDA device here)")
    if isinstance(device, torch.device):
        kind, index = device.type, device.index
    elif isinstance(device, str) and re.fullmatch(r"(cpu|cuda)(:\d+)?", device):
        kind, _, digits = device.partition(":")
        index = int(digits) if digits else None
    elif is_int(device):
        kind, index = "cuda", int(device)
    else:
        kind, index = None, None
    ok = kind == "cpu" or (kind == "cuda" and count > 0 and (index is None or 0 <= index < count))
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {device!r}")
    return torch.device(kind, index)


def check_prompt(prompt, vocab_size: int) -> list[int]:
    """The prompt as a list of ints (a list, tuple, 1-D int tensor or array of token ids)."""
    if isinstance(prompt, torch.Tensor) and prompt.dim() == 1 and not prompt.is_floating_point():
        prompt = prompt.tolist()
    elif isinstance(prompt, np.ndarray) and prompt.ndim == 1 and np.issubdtype(prompt.dtype, np.integer):
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)):
        raise ValueError(f"prompt_token_ids must be a list of ints, got {type(prompt).__name__}")
    bad = [t for t in prompt if not is_token(t, vocab_size)]
    if bad:
        raise ValueError(f"prompt_token_ids must be token ids in [0, {vocab_size}), got {bad[:5]}")
    return [int(t) for t in prompt]


def check_drafts(drafts, num_reqs: int, vocab_size: int, max_logits_per_req: int) -> np.ndarray:
    """Drafts as an int64 matrix [num_reqs, D] padded with -1 (D = 0 without drafts).

    Accepts a list with one list of token ids per request, or an int array / tensor
    [num_reqs, D] whose rows hold each request's drafts first, then -1 padding."""
    if drafts is None:
        return np.zeros((num_reqs, 0), dtype=np.int64)
    if isinstance(drafts, (torch.Tensor, np.ndarray)):
        arr = drafts.cpu().numpy() if isinstance(drafts, torch.Tensor) else drafts
        if arr.ndim != 2 or arr.shape[0] != num_reqs or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"draft_token_ids as an array must be integers of shape [{num_reqs}, D]")
        arr = arr.astype(np.int64)
        valid = arr >= 0
        if (valid[:, 1:] & ~valid[:, :-1]).any():
            raise ValueError("draft_token_ids: each row must hold its drafts first, then -1 padding")
    else:
        if not isinstance(drafts, (list, tuple)) or not all(isinstance(d, (list, tuple)) for d in drafts):
            raise ValueError("draft_token_ids must be a list with one list of token ids per request")
        if len(drafts) != num_reqs:
            raise ValueError(f"draft_token_ids must have one list per request ({num_reqs}), got {len(drafts)}")
        width = max((len(d) for d in drafts), default=0)
        if any(not is_token(t, vocab_size) for d in drafts for t in d):
            bad = [t for d in drafts for t in d if not is_token(t, vocab_size)]
            raise ValueError(f"draft_token_ids must be token ids in [0, {vocab_size}), got {bad[:5]}")
        arr = np.full((num_reqs, width), -1, dtype=np.int64)
        for i, d in enumerate(drafts):
            arr[i, : len(d)] = d
        valid = arr >= 0
    most = int(valid.sum(axis=1).max()) if num_reqs and arr.shape[1] else 0
    if most > max_logits_per_req - 1:
        raise ValueError(f"draft_token_ids: at most max_num_logits_per_req - 1 = {max_logits_per_req - 1} "
                         f"drafts per request, got {most}")
    if (arr >= vocab_size).any():
        raise ValueError(f"draft_token_ids must be token ids in [0, {vocab_size}), got {arr[arr >= vocab_size][:5].tolist()}")
    return arr[:, :most] if arr.shape[1] > most else arr


def check_bitmask(mask, num_rows: int, vocab_size: int, *, name: str = "grammar_bitmask", op: str = ""):
    """None, or a packed int32 grammar mask [num_rows, ceil(V/32)] (bit = allowed). op: the
    caller named in front of the message ("tpsample.ops.sample"), if any."""
    words = (vocab_size + 31) // 32
    if mask is None or (isinstance(mask, torch.Tensor) and mask.dtype == torch.int32
                        and tuple(mask.shape) == (num_rows, words)):
        return mask
    got = f"{mask.dtype} {list(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
    raise ValueError(f"{op + ': ' if op else ''}{name} must be None or an int32 tensor [rows, ceil(V/32)] = "
                     f"[{num_rows}, {words}], got {got}")


def check_logits(x, num_rows: int, width: int, name: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor [rows, V_r]")
    if x.dim() != 2 or tuple(x.shape) != (num_rows, width):
        raise ValueError(f"{name} must have shape [{num_rows}, {width}] (plan rows, this rank's vocab "
                         f"shard), got {list(x.shape)}")


def check_draft_probs(p, num_rows: int, width: int, *, draft_rows=None, full_rows: bool = False) -> None:
    """Shape, dtype, and values: every entry a probability in [0, 1] (NaN and inf rejected).

    draft_rows: indices (in logits order) of the rows that verify a draft token. When given and
    the rows are full vocabulary rows (`full_rows`, i.e. TP=1), such a row must not be all zero:
    the draft token was drawn from it. (Under TP a rank holds a shard, where zeros are legal.)
    Costs one [rows] reduction and one host sync; no [rows, V] temporary.
    """
    check_logits(p, num_rows, width, "draft_probs")
    if num_rows == 0 or width == 0:
        return
    lo, hi = torch.aminmax(p, dim=1)                     # NaN anywhere in a row -> NaN here
    ok = (lo >= 0) & (hi <= 1)
    if draft_rows is not None and full_rows and len(draft_rows):
        idx = torch.as_tensor(list(draft_rows), dtype=torch.int64, device=p.device)
        ok[idx] &= hi[idx] > 0
    if not bool(ok.all()):
        row = int((~ok).nonzero()[0, 0])
        raise ValueError(f"draft_probs row {row} must hold probabilities in [0, 1] (finite, not negative, "
                         f"not all zero on a draft row), got min {float(lo[row]):g}, max {float(hi[row]):g}")
