"""Where a sampling call's host time goes (cProfile of plan + sample + reading tokens, on CUDA)."""
import cProfile
import pstats
import sys

import torch

import tpsample

rows, vocab = 256, 151936
cases = {"greedy": dict(temperature=0.0), "topk_topp": dict(temperature=0.8, top_k=50, top_p=0.9)}
for name, params in cases.items():
    s = tpsample.Sampler(vocab, max_num_reqs=rows, strategy="replicated", seed=1, device="cuda")
    for i in range(rows):
        s.add_request(f"r{i}", tpsample.SamplingParams(seed=i, **params), [1, 2, 3])
    ids = [f"r{i}" for i in range(rows)]
    x = torch.randn(rows, vocab, device="cuda") * 3
    for _ in range(5):
        s.sample(x, s.plan(ids)).token_lists()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        s.sample(x, s.plan(ids)).token_lists()
    prof.disable()
    print(f"== {name}: 20 calls")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
