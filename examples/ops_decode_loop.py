"""A plain decode loop that samples with `tpsample.ops.sample` (run: python examples/ops_decode_loop.py).

It builds a tiny random Llama checkpoint (`tpsample.testing.toy`, nothing is downloaded), loads
it with transformers on CPU, and decodes a small batch of requests, each with its own sampling
parameters and seed. The engine-side state is three things per request: its parameters, its
seed and how many tokens it has generated; every step gathers them into per-row tensors and
calls `ops.sample` once for the whole batch, at position = prompt length + tokens generated.

The model runs each request on its own, over its whole sequence every step (no KV cache: the
model is tiny, and the loop stays independent of transformers' cache API). Batched CPU matmuls
may round differently with the batch size, and the point here is that the *sampler* is
batch-invariant: a request's tokens do not depend on which others share its batch (`--only`).
"""
from __future__ import annotations

import argparse
import json
import tempfile

import torch

from tpsample import ops
from tpsample.testing.toy import make_random_checkpoint

VOCAB = 384
# (name, prompt, temperature, top_k, top_p, min_p, seed): greedy, plain, top-k, top-p + min-p
REQUESTS = [
    ("greedy", [5, 17, 42], 0.0, 0, 1.0, 0.0, 0),
    ("plain", [9, 3], 1.0, 0, 1.0, 0.0, 1234),
    ("top_k", [100, 101, 102, 103], 0.8, 20, 1.0, 0.0, 7),
    ("top_p", [64], 1.2, 0, 0.9, 0.02, 2**40 + 5),
]


def load_model(folder: str):
    from transformers import AutoModelForCausalLM
    make_random_checkpoint(folder, family="llama", vocab_size=VOCAB, init_std=0.3, seed=0)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def decode(model, requests, steps: int, seed_offset: int = 0) -> dict[str, list[int]]:
    """Each request's generated tokens after `steps` decode steps."""
    sequences = [list(r[1]) for r in requests]
    out: dict[str, list[int]] = {r[0]: [] for r in requests}
    # per-row parameters, as an engine keeps them per slot (gathered once here: the batch is fixed)
    temperature = torch.tensor([r[2] for r in requests])
    top_k = torch.tensor([r[3] for r in requests])
    top_p = torch.tensor([r[4] for r in requests])
    min_p = torch.tensor([r[5] for r in requests])
    seeds = torch.tensor([r[6] + seed_offset for r in requests])
    prompt_len = torch.tensor([len(r[1]) for r in requests])
    with torch.no_grad():
        for step in range(steps):
            logits = torch.stack([model(input_ids=torch.tensor([seq])).logits[0, -1] for seq in sequences])
            sampled = ops.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                 seeds=seeds, positions=prompt_len + step)
            for r, seq, t in zip(requests, sequences, sampled.token_ids.tolist()):
                out[r[0]].append(t)
                seq.append(t)
    return out


def main(argv=None) -> dict[str, list[int]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--only", nargs="*", help="decode only these requests (by name)")
    ap.add_argument("--seed-offset", type=int, default=0, help="added to every request's seed")
    args = ap.parse_args(argv)
    requests = [r for r in REQUESTS if not args.only or r[0] in args.only]
    with tempfile.TemporaryDirectory() as folder:
        model = load_model(folder)
        tokens = decode(model, requests, args.steps, args.seed_offset)
    for name, toks in tokens.items():
        print(f"{name:>7}: {toks}")
    print("RESULT " + json.dumps(tokens))
    return tokens


if __name__ == "__main__":
    main()
