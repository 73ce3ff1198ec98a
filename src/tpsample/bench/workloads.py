"""The request mixes `tpsample bench sampler --workload` offers (no heavy imports: the CLI lists them).

Each maps request index i to `SamplingParams` keyword arguments.
"""
WORKLOADS = {
    "topk-topp": lambda i: {"temperature": 0.8, "top_k": 50, "top_p": 0.9},
    "topk-topp-lp": lambda i: {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "logprobs": 5 if i % 4 == 0 else None},
    "topp": lambda i: {"temperature": 0.8, "top_p": 0.9},
    "minp": lambda i: {"temperature": 1.0, "min_p": 0.05},
    "temperature": lambda i: {"temperature": 0.8},
    "greedy": lambda i: {"temperature": 0.0},
}
