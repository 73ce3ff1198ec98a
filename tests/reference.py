"""A slow, obviously correct float64 reference of the sampling semantics (docs/semantics.md),
spec decode included.

One row at a time, Python loops and full sorts, float64 throughout; it shares only the noise
bits (`rng`) with the fast path. Tests hold every strategy to it.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from tpsample.noise import SALT_DRAW, SALT_XTC, W_MAX, row_keys, seed_to_int64, uniform01, uniform_bits
from tpsample.params import SamplingParams

NEG = float("-inf")


def gumbel64(seed: int, pos: int, vocab: int, salt: int = SALT_DRAW) -> list[float]:
    k0, k1 = row_keys(torch.tensor([seed_to_int64(seed)]), torch.tensor([pos]), salt)
    u = uniform_bits(k0, k1, torch.arange(vocab))[0].tolist()
    out = []
    for b in u:
        w = min((b + 0.5) * 2.0**-32, W_MAX)
        out.append(-math.log(-math.log1p(-w)))
    return out


def argmax_first(vals: list[float]) -> int:
    best, arg = NEG, -1
    for i, v in enumerate(vals):
        if v > best:
            best, arg = v, i
    return arg


def process_row(raw: list[float], p: SamplingParams, prompt: list[int], output: list[int],
                eos: Optional[int], allowed_bits: Optional[list[bool]]) -> list[float]:
    """Steps 2-5 on a copy of the row (NaN already mapped to -inf)."""
    l = list(raw)
    V = len(l)
    if allowed_bits is not None:
        l = [v if allowed_bits[i] else NEG for i, v in enumerate(l)]
    if p.allowed_token_ids is not None:
        ok = set(p.allowed_token_ids)
        l = [v if i in ok else NEG for i, v in enumerate(l)]
    for t, b in (p.logit_bias or {}).items():
        l[t] += b
    if len(output) < p.min_tokens:
        for t in list(p.stop_token_ids or []) + ([eos] if eos is not None and not p.ignore_eos else []):
            l[t] = NEG
    seen = set(prompt) | set(output)
    if p.repetition_penalty != 1.0:
        for t in seen:
            l[t] = l[t] / p.repetition_penalty if l[t] > 0 else l[t] * p.repetition_penalty
    counts: dict[int, int] = {}
    for t in output:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        l[t] -= p.frequency_penalty * c + p.presence_penalty * (1 if c > 0 else 0)
    for w in p.bad_words_token_ids or ():
        n = len(w) - 1
        if n == 0 or (len(output) >= n and output[len(output) - n:] == list(w[:-1])):
            l[w[-1]] = NEG
    assert len(l) == V
    return l


def top_n_sigma_threshold(l: list[float], n_sigma: float, vocab: int) -> float:
    """M - n * sigma, sigma from the values on the fixed-point grid of docs/semantics.md."""
    fin = [v for v in l if math.isfinite(v)]
    if n_sigma <= 0 or not fin:
        return NEG
    top, low = max(fin), min(fin)
    bits = (62 - max(1, math.ceil(math.log2(vocab)))) // 2
    scale = 2.0 ** (bits - math.frexp(top - low)[1])
    q = [math.floor((top - v) * scale) for v in fin]
    n, s1, s2 = len(q), sum(q), sum(x * x for x in q)
    var = max(s2 / n - (s1 / n) ** 2, 0.0)
    return top - n_sigma * math.sqrt(var) / scale


def xtc_row(l: list[float], p: SamplingParams, seed: int, pos: int) -> list[float]:
    """XTC after top-p: when the (seed, pos) coin comes up and two or more kept tokens have
    probability >= threshold, keep only values <= the smallest of theirs (fp64 probabilities)."""
    if p.xtc_probability <= 0:
        return l
    u = uniform01(torch.tensor([seed_to_int64(seed)]), torch.tensor([pos]), SALT_XTC)[0].item()
    m = max(l)
    if not u < float(np.float32(p.xtc_probability)) or m == NEG:
        return l
    e = [math.exp(v - m) if v > NEG else 0.0 for v in l]
    z = sum(e)
    qual = [v for v, w in zip(l, e) if v > NEG and w / z >= float(np.float32(p.xtc_threshold))]
    if len(qual) < 2:
        return l
    return [v if v <= min(qual) else NEG for v in l]


def filter_row(l: list[float], p: SamplingParams, seed: int = 0, pos: int = 0) -> list[float]:
    """Steps 6-9 for a sampled row: temperature, top-n-sigma, min-p, top-k, top-p (fp64 masses), XTC."""
    l = [v / p.temperature for v in l]
    fin = [v for v in l if v > NEG]
    if not fin:
        return l
    cut = top_n_sigma_threshold(l, p.top_n_sigma, len(l))
    l = [v if v >= cut else NEG for v in l]
    if p.min_p > 0:
        cut = max(fin) + math.log(p.min_p)
        l = [v if v >= cut else NEG for v in l]
    if p.top_k > 0:
        srt = sorted((v for v in l), reverse=True)
        kth = srt[p.top_k - 1] if p.top_k <= len(srt) else NEG
        l = [v if v >= kth else NEG for v in l]
    if p.top_p < 1:
        m = max(v for v in l)
        if m > NEG:
            e = [math.exp(v - m) if v > NEG else 0.0 for v in l]
            z = sum(e)
            order = sorted(range(len(l)), key=lambda i: (-l[i], i))
            above, kept, i = 0.0, set(), 0
            while i < len(order):           # walk tie groups: mass strictly above the group
                j = i
                while j < len(order) and l[order[j]] == l[order[i]]:
                    j += 1
                if l[order[i]] > NEG and above / z < p.top_p:
                    kept.update(order[i:j])
                above += sum(e[order[t]] for t in range(i, j))
                i = j
            l = [v if i in kept else NEG for i, v in enumerate(l)]
    return xtc_row(l, p, seed, pos)


def log_softmax(l: list[float]) -> list[float]:
    m = max(l)
    if m == NEG:
        return [NEG] * len(l)
    if m == math.inf:                  # +inf logits hold the whole mass: 0 for them, -inf elsewhere
        return [0.0 if v == math.inf else NEG for v in l]
    z = math.log(sum(math.exp(v - m) for v in l if v > NEG)) + m
    return [v - z if v > NEG else NEG for v in l]


def logprob_entry(l: list[float], token: int, n: int, logits: bool = False) -> tuple[list[int], list[float], int]:
    """(ids, values, rank) of the token and the top-n: log-softmax values, or the row's own (logits)."""
    lp = list(l) if logits else log_softmax(l)
    rank = 1 + sum(1 for v in lp if v > lp[token])
    order = sorted(range(len(l)), key=lambda i: (-lp[i], i))[:n]
    return [token] + order, [lp[token]] + [lp[i] for i in order], rank


def sample_row(raw: list[float], p: SamplingParams, seed: int, pos: int, prompt: list[int],
               output: list[int], eos: Optional[int] = None, allowed_bits=None,
               draft: int = -1) -> dict:
    """One row: the emitted token (draft verification included), logprobs, flags."""
    nans = sum(1 for v in raw if v != v)
    raw = [NEG if v != v else v for v in raw]
    masked = [v if allowed_bits is None or allowed_bits[i] else NEG for i, v in enumerate(raw)]
    l = process_row(raw, p, prompt, output, eos, allowed_bits)
    V = len(l)
    if p.temperature == 0:
        proc, tok = l, argmax_first(l)
        best = l[tok] if tok >= 0 else NEG
    else:
        proc = filter_row(l, p, seed, pos)
        g = gumbel64(seed, pos, V)
        z = [v + g[i] if v > NEG else NEG for i, v in enumerate(proc)]
        tok = argmax_first(z)
        best = z[tok] if tok >= 0 else NEG
    fallback = not math.isfinite(best)
    if fallback:       # the best grammar-allowed token (the raw row when there is no grammar)
        tok = argmax_first(masked)
        tok = 0 if tok < 0 else tok
    emitted, accepted = tok, False
    if draft >= 0 and not fallback:
        accepted, emitted = _verify(draft, tok)
    res = {"token": emitted, "accepted": accepted, "fallback": fallback, "nans": nans}
    if p.logprobs is not None:
        res["logprobs"] = logprob_entry(logprob_row(p, masked, proc), emitted, p.logprobs,
                                        p.logprobs_mode.endswith("_logits"))
    if p.kept_support is not None:
        res["support"] = support_entry(proc, tok, fallback, p)
    return res


def logprob_row(p: SamplingParams, masked: list[float], proc: list[float]) -> list[float]:
    """The row a logprobs_mode reads: processed (after step 9; greedy: after 5), raw (after the
    grammar mask), or raw / T for temperature_logprobs (greedy: T = 1)."""
    if p.logprobs_mode in ("processed", "processed_logprobs", "processed_logits"):
        return proc
    if p.logprobs_mode == "temperature_logprobs" and p.temperature > 0:
        return [v / p.temperature for v in masked]
    return masked


def support_entry(proc: list[float], token: int, fallback: bool, p: SamplingParams) -> tuple[list[int], int]:
    """(the cap most probable kept ids, ties -> lower id; how many were kept): a sampled row keeps
    the finite entries of its processed row, a greedy row its token."""
    if p.temperature == 0:
        kept = [] if fallback else [token]
    else:
        kept = sorted((i for i, v in enumerate(proc) if v > NEG), key=lambda i: (-proc[i], i))
    return kept[: p.kept_support], len(kept)


def _verify(draft: int, main: int) -> tuple[bool, int]:
    """One-hot draft verification: accept iff the draft is the token plain decoding emits here
    (`main`, greedy or drawn); at a rejection emit that token (docs/semantics.md)."""
    return draft == main, main


def sample_request(rows: list[list[float]], p: SamplingParams, seed: int, prompt: list[int],
                   output: list[int], drafts: list[int], eos: Optional[int] = None,
                   bitmasks: Optional[list] = None) -> tuple[list[int], list[dict]]:
    """All rows of one request (drafts then bonus): the emitted tokens and per-row results."""
    emitted, results = [], []
    for j, row in enumerate(rows):
        draft = drafts[j] if j < len(drafts) else -1
        r = sample_row(row, p, seed, len(prompt) + len(output) + j, prompt, output + drafts[:j], eos,
                       None if bitmasks is None else bitmasks[j], draft)
        results.append(r)
        emitted.append(r["token"])
        if not r["accepted"]:
            break
    return emitted, results


def unpack_bitmask(mask_row: torch.Tensor, vocab: int) -> list[bool]:
    bits = []
    for t in range(vocab):
        bits.append(bool((int(mask_row[t // 32]) >> (t % 32)) & 1))
    return bits


def propose_ngram(tokens: list[int], *, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k prompt-lookup drafts (possibly none) continuing `tokens`: the tokens that followed the
    latest earlier occurrence of the last n tokens, n from max_n down to min_n (`NgramProposer`)."""
    if k <= 0:
        return []
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        # latest match first: the most recent context predicts best
        for start in range(total - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []
