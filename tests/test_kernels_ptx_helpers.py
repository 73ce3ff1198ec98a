"""The hist pass's packed list claims (`tlutil.claim_slots`, one atomic per 4 entries a thread)
give a list with every selected entry in its own slot, each group's slots the first ones of that
group, and counters that count them. Compiled PTX: CUDA only."""
import pytest
import torch

triton = pytest.importorskip("triton")

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="inline PTX needs compiled CUDA code")]


@pytest.fixture(scope="module")
def probes():
    import tlutil_probes
    return tlutil_probes


@pytest.mark.parametrize(("lg", "rate"), [(4, 0.02), (4, 0.6), (1, 0.3), (8, 1.0), (4, 0.0)])
def test_packed_claims_give_every_selected_entry_its_own_slot_at_the_front_of_its_group(probes, lg, rate):
    n, block, group_words = 1 << 16, 1024, 16
    gen = torch.Generator().manual_seed(int(rate * 100) + lg)
    sel = (torch.rand(n, generator=gen) < rate).to(torch.int32).cuda()
    line = torch.zeros(lg * group_words, dtype=torch.int32, device="cuda")
    slot = torch.empty(n, dtype=torch.int32, device="cuda")
    probes.claims[(n // block,)](sel, line, slot, n, LG=lg, GROUP_WORDS=group_words, BLOCK=block, num_warps=4)
    counts = line.view(lg, group_words)[:, 0].long().cpu()
    assert int(line.view(lg, group_words)[:, 1:].abs().sum()) == 0     # only each group's counter moved
    taken = slot[sel.bool()].long().cpu()
    assert int(counts.sum()) == taken.numel() == int(sel.sum())
    assert taken.unique().numel() == taken.numel()                      # no slot twice
    for g in range(lg):                                                 # group g: slots i * lg + g, i < its count
        places = taken[taken % lg == g] // lg
        assert sorted(places.tolist()) == list(range(int(counts[g])))
