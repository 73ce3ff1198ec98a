"""What the sampler benchmarks sample (no heavy imports: the command line lists these names).

`WORKLOADS`: the request mixes of `tpsample bench sampler` (strategies x TP); each maps request
index i to `SamplingParams` keyword arguments, and may give every request one-hot draft tokens
to verify (a step then has rows = requests x (1 + drafts)). `CLASSES` are the feature classes a
TP run reports on (`--workload classes`).

`CASES`: the cases of `bench sampler --compare`, one parameter set for every row. A new sampler
is one `Case` here (and, for the TP bench, one `Workload`): the tpsample columns run whatever
`SamplingParams` takes, and the FlashInfer columns appear only where FlashInfer has the op
(`bench.flashinfer.recipe`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

DRAFT_TOKENS = 3          # one-hot drafts per request in the "drafts" workload
PROMPT_LEN = 2000         # history of the penalties case


@dataclass(frozen=True)
class Workload:
    params: Callable[[int], dict]      # request index -> SamplingParams keyword arguments
    title: str
    num_drafts: int = 0                # one-hot draft tokens per request


def _same(**params) -> Callable[[int], dict]:
    return lambda i: dict(params)


WORKLOADS = {
    "greedy": Workload(_same(temperature=0.0), "greedy"),
    "temperature": Workload(_same(temperature=0.8), "T 0.8"),
    "topk": Workload(_same(temperature=0.8, top_k=50), "top-k 50"),
    "minp": Workload(_same(temperature=1.0, min_p=0.05), "min-p 0.05"),
    "topk-topp": Workload(_same(temperature=0.8, top_k=50, top_p=0.9), "top-k 50 + top-p 0.9"),
    "topp": Workload(_same(temperature=0.8, top_p=0.9), "top-p 0.9"),
    "topp0.95-t1": Workload(_same(temperature=1.0, top_p=0.95), "T 1, top-p 0.95"),
    "logprobs5": Workload(_same(temperature=0.8, top_k=50, top_p=0.9, logprobs=5), "top-k + top-p, logprobs 5"),
    "drafts": Workload(_same(temperature=0.8, top_k=50, top_p=0.9), f"top-k + top-p, {DRAFT_TOKENS} one-hot drafts",
                       num_drafts=DRAFT_TOKENS),
    "topk-topp-lp": Workload(lambda i: {"temperature": 0.8, "top_k": 50, "top_p": 0.9,
                                        "logprobs": 5 if i % 4 == 0 else None},
                             "top-k + top-p, logprobs 5 on every 4th row"),
}
CLASSES = ("greedy", "temperature", "topk", "minp", "topk-topp", "topp", "topp0.95-t1", "logprobs5", "drafts")


@dataclass(frozen=True)
class Case:
    name: str                          # the command line's and the JSON's name
    title: str                         # the table's and the plot's
    params: dict = field(default_factory=dict)   # SamplingParams keyword arguments of every row
    prompt_len: int = 1                # history tokens per request (what penalties read)


CASES = (
    Case("greedy", "greedy", {"temperature": 0.0}),
    Case("temperature", "temperature 0.8", {"temperature": 0.8}),
    Case("topk", "top-k 50", {"temperature": 0.8, "top_k": 50}),
    Case("minp", "min-p 0.05", {"temperature": 0.8, "min_p": 0.05}),
    Case("topp", "top-p 0.9", {"temperature": 0.8, "top_p": 0.9}),
    Case("topk_topp", "top-k 50 + top-p 0.9", {"temperature": 0.8, "top_k": 50, "top_p": 0.9}),
    Case("topk_topp_lp5", "top-k + top-p, logprobs 5", {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "logprobs": 5}),
    Case("penalties", "top-k + top-p, penalties", {"temperature": 0.8, "top_k": 50, "top_p": 0.9,
                                                   "repetition_penalty": 1.1, "frequency_penalty": 0.2},
         prompt_len=PROMPT_LEN),
)
CASE_NAMES = tuple(c.name for c in CASES)
