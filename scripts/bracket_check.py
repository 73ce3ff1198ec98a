"""Full-size check of top-p without top-k on a GPU: tokens against the torch twin, and how many
rows the list kernel settled, how many the lean pass settled (the rest took the bracket's collect
pass) and how many fell back to the exact search (randn and Zipf-like logits, several top-p /
min-p).
    python scripts/bracket_check.py [rows] [vocab]
Prints one line per case and ends with one JSON line."""
import json
import sys

import torch

from tpsample import noise
from tpsample.kernels import torch_ref
from tpsample.kernels.config import fallback_counter, lean_counter, listed_counter
from tpsample.kernels.dispatch import sample_rows


def logits(kind, rows, vocab, gen):
    if kind == "randn":
        return torch.randn(rows, vocab, device="cuda", generator=gen) * 3
    ranks = torch.argsort(torch.rand(rows, vocab, device="cuda", generator=gen), dim=1).float() + 1
    return -1.1 * torch.log(ranks) + 0.01 * torch.randn(rows, vocab, device="cuda", generator=gen)


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 151936
    gen = torch.Generator("cuda").manual_seed(0)
    out = []
    for kind in ("randn", "zipf"):
        for temp, top_p, min_p in ((0.8, 0.9, 0.0), (1.0, 0.95, 0.0), (1.0, 0.5, 0.0), (0.7, 0.9, 0.05)):
            x = logits(kind, rows, vocab, gen)
            t = torch.full((rows,), temp, device="cuda")
            k = torch.zeros(rows, dtype=torch.int32, device="cuda")
            p = torch.full((rows,), top_p, device="cuda")
            lmp = torch.full((rows,), float("-inf") if min_p == 0 else float(torch.log(torch.tensor(min_p))),
                             device="cuda")
            k0, k1 = noise.row_keys(torch.arange(rows, device="cuda") + 5, torch.arange(rows, device="cuda"),
                                    noise.SALT_DRAW)
            counters = (fallback_counter(x.device), listed_counter(x.device), lean_counter(x.device))
            before = [int(c.item()) for c in counters]
            got, valid = sample_rows(x, t, k, p, lmp, k0, k1)
            fell, listed, lean = (int(c.item()) - b for c, b in zip(counters, before))
            want, _ = torch_ref.sample_rows(x, t, k, p, lmp, k0, k1)
            same = int((got == want).sum())
            line = {"logits": kind, "T": temp, "top_p": top_p, "min_p": min_p, "rows": rows,
                    "same_tokens": same, "listed_rows": listed, "lean_rows": lean, "fallback_rows": fell}
            print(line)
            out.append(line)
    print(json.dumps({"bench": "bracket_check", "results": out}))


if __name__ == "__main__":
    main()
