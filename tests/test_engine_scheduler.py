"""The scheduler alone (no model): budget, KV blocks, preemption and n-gram drafts."""
from __future__ import annotations

import random

from reference import propose_ngram

from tpsample import SamplingParams
from tpsample.engine.blocks import BlockManager, BlockTables
from tpsample.engine.config import EngineConfig, NgramConfig
from tpsample.engine.ngram import NgramProposer
from tpsample.engine.request import Request
from tpsample.engine.scheduler import Scheduler

VOCAB = 100


def _run(cfg: EngineConfig, num_blocks: int, requests: list[Request], max_model_len: int = 512):
    """Drive the scheduler with a fake sampler that accepts every draft; check each step's invariants.

    A rank's block tables are rebuilt from the steps' diffs alone and must equal the scheduler's."""
    sched = Scheduler(cfg, num_blocks=num_blocks, max_model_len=max_model_len, eos_token_ids=())
    tables = BlockTables(cfg.max_num_seqs, -(-max_model_len // cfg.block_size) + 8)
    by_id = {r.req_id: r for r in requests}
    for r in requests:
        sched.add(r)
    in_sampler: set[str] = set()
    steps = 0
    while sched.has_unfinished():
        step = sched.schedule()
        steps += 1
        assert 0 < len(step.token_ids) <= cfg.token_budget
        assert sum(len(r.block_ids) for r in sched.running) <= num_blocks
        for rid in step.remove:
            tables.remove(rid)
        for rid, _, _ in step.add:
            tables.add(rid)
        tables.apply(step.block_updates)
        for rid, seq_len in zip(step.seq_req_ids, step.seq_lens):
            row = tables.rows([rid])[0]
            held = tables.table[row, :tables.num_pages[row]].tolist()
            assert held == by_id[rid].block_ids, "the diffs rebuild exactly the scheduler's table"
            assert len(held) * cfg.block_size >= seq_len, "blocks must cover every written position"
        in_sampler -= set(step.remove)
        in_sampler |= {rid for rid, _, _ in step.add}
        assert len(in_sampler) <= cfg.max_num_seqs
        drafts = step.draft_token_ids or [[] for _ in step.sample_req_ids]
        sampled = [d + [random.randrange(VOCAB)] for d in drafts]
        sched.update(sampled, [len(s) for s in sampled], None)
    return sched, steps


def _requests(n: int, max_tokens: int) -> list[Request]:
    return [Request(req_id=f"r{i}", index=i, prompt_token_ids=[(i + j) % VOCAB for j in range(3 + i % 9)],
                    params=SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for i in range(n)]


def test_scheduler_preempts_under_kv_pressure_and_finishes_every_request_at_full_length():
    random.seed(0)
    cfg = EngineConfig(model="unused", block_size=4, max_num_seqs=6, max_num_batched_tokens=10)
    reqs = _requests(20, max_tokens=15)
    sched, _ = _run(cfg, num_blocks=12, requests=reqs)
    assert sched.num_preemptions > 0
    assert all(len(r.output_token_ids) == 15 and r.finish_reason == "length" for r in reqs)
    assert sched.blocks.num_free == 12, "every block returns to the pool"


def test_drafts_shorten_the_run_and_respect_max_tokens():
    random.seed(0)
    spec = EngineConfig(model="unused", speculative_ngram=NgramConfig(num_speculative_tokens=4))
    plain = EngineConfig(model="unused")
    repetitive = lambda: [Request(req_id=f"r{i}", index=i, prompt_token_ids=[1, 2, 3] * 4,  # noqa: E731
                                  params=SamplingParams(max_tokens=23, ignore_eos=True)) for i in range(3)]
    spec_reqs, plain_reqs = repetitive(), repetitive()
    _, spec_steps = _run(spec, 64, spec_reqs)
    _, plain_steps = _run(plain, 64, plain_reqs)
    assert spec_steps < plain_steps
    assert all(len(r.output_token_ids) == 23 for r in spec_reqs)


def test_ngram_proposes_what_followed_the_latest_longest_match():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], k=2, min_n=1, max_n=3) == [7, 1]
    assert propose_ngram([5, 6, 7], k=3, min_n=1, max_n=3) == []
    assert propose_ngram([4, 4, 4], k=5, min_n=1, max_n=2) == [4]


def test_block_manager_hands_out_lowest_free_blocks_first():
    bm = BlockManager(8, 4)
    a, b = [], []
    bm.grow(a, 9)
    bm.grow(b, 4)
    assert a == [0, 1, 2] and b == [3]
    bm.free(a)
    bm.grow(b, 8)
    assert b == [3, 0] and bm.num_free == 6


def test_incremental_ngram_proposer_gives_the_reference_drafts_on_random_histories():
    rng = random.Random(0)
    for case in range(80):
        alphabet = rng.choice([2, 3, 5, 20])
        base = rng.choice([0, 0, (1 << 21) - 3])    # ids near 2**21: the packed keys' edge
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 4)
        proposer = NgramProposer(min_n=min_n, max_n=max_n)
        prompt = [base + rng.randrange(alphabet) for _ in range(rng.randint(1, 30))]
        output: list[int] = []
        for _ in range(40):
            k = rng.randint(0, 5)
            got = proposer.propose(f"r{case}", prompt, output, k)
            assert got == propose_ngram(prompt + output, k=k, min_n=min_n, max_n=max_n)
            output += [base + rng.randrange(alphabet) for _ in range(rng.randint(1, 3))]
        proposer.drop(f"r{case}")
