"""The search for v* that bisects only while many keys are left (`tlutil.min_key_mass_few`) finds
the same kappa as the full bisection (`min_key_mass_below`) and as a brute force over exact
integers: the smallest kappa in (lo, hi] with float64(base + mass of keys > kappa) < target. Cases
cover keys spread over a wide range (the bisection runs, then the pairwise finish), few keys
from the start (the finish alone), ties crowding two keys (the bisection down to lo + 1 == hi),
keys packed in a narrow range, zero masses, and targets on the float64 boundaries (the float64
of a partial sum, and one ulp either side)."""
import random

import pytest
import torch

pytest.importorskip("triton")

pytestmark = pytest.mark.usefixtures("triton_interpreter")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
N = 256


@pytest.fixture(scope="module")
def probes():
    import tlutil_probes
    return tlutil_probes


def brute_force(keys, e, base, target, lo, hi):
    """Smallest kappa in (lo, hi] whose exact mass above converts below target (f only steps at
    the keys, so the candidates are lo + 1 and the keys themselves)."""
    pairs = [(k, m) for k, m in zip(keys, e) if k >= 0]
    for kappa in sorted({lo + 1} | {k for k, _ in pairs if lo < k <= hi}):
        if float(base + sum(m for k, m in pairs if k > kappa)) < target:
            return kappa
    raise AssertionError("the case breaks the precondition")


def make_case(rng, kind):
    lo = rng.randrange(0, 1 << 31)
    span = {"spread": 1 << 24, "few": 1 << 20, "ties": 1 << 22, "narrow": 200, "zeros": 1 << 16}[kind]
    hi = lo + span
    count = {"spread": 200, "few": rng.randrange(1, 9), "ties": 150, "narrow": 120, "zeros": 100}[kind]
    if kind == "ties":
        keys = [hi - rng.randrange(0, 2) for _ in range(count)]      # two keys, lo + 1 < both
    else:
        keys = [rng.randrange(lo + 1, hi + 1) for _ in range(count)]
    big = rng.choice([20, 40, 44])
    e = [rng.randrange(0, 1 << big) if kind != "zeros" or rng.random() < 0.5 else 0 for _ in range(count)]
    base = rng.choice([0, rng.randrange(0, 1 << 60)])
    # the target: the float64 of the mass from a key up, nudged across its rounding boundary
    pivot = rng.choice(keys)
    at = base + sum(m for k, m in zip(keys, e) if k >= pivot)
    target = float(at)
    nudge = rng.choice([0, 1, -1])
    if nudge:
        target = float(torch.nextafter(torch.tensor(target, dtype=torch.float64),
                                       torch.tensor(nudge * float("inf"), dtype=torch.float64)))
    total = base + sum(e)
    if not float(base) < target <= float(total):     # keep the precondition: holds at hi, fails at lo
        target = float(total)
        if not float(base) < target:
            e[0] += 1 << 30
            target = float(base + sum(e))
    order = list(range(N))
    rng.shuffle(order)
    slot_keys, slot_e = [-1] * N, [0] * N
    for i, (k, m) in enumerate(zip(keys, e)):
        slot_keys[order[i]], slot_e[order[i]] = k, m
    return slot_keys, slot_e, base, target, lo, hi


@pytest.mark.parametrize("few", [8, 32])
def test_the_short_search_finds_the_full_bisections_kappa_exactly(probes, few):
    rng = random.Random(few)
    cases = [make_case(rng, kind) for kind in ("spread", "few", "ties", "narrow", "zeros") for _ in range(6)]
    keys = torch.tensor([c[0] for c in cases], dtype=torch.int64, device=DEV)
    e = torch.tensor([c[1] for c in cases], dtype=torch.int64, device=DEV)
    args = torch.tensor([[c[2], c[4], c[5]] for c in cases], dtype=torch.int64, device=DEV)
    target = torch.tensor([c[3] for c in cases], dtype=torch.float64, device=DEV)
    out = torch.empty((len(cases), 2), dtype=torch.int64, device=DEV)
    scratch = torch.empty(len(cases) * (2 * few + 1), dtype=torch.int64, device=DEV)
    probes.mass_searches[(len(cases),)](keys, e, args, target, out, scratch, N=N, FEW=few, PTX=DEV == "cuda")
    out = out.cpu().tolist()
    for (bisected, short), case in zip(out, cases):
        want = brute_force(*case)
        assert bisected == want
        assert short == want
