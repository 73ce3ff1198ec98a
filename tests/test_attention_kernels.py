"""The Triton paged attention and fused model kernels equal their torch twins (the CPU path).

On CPU they run under the Triton interpreter, switched on per test through monkeypatch (the
kernels are compiled on first use, keyed by TRITON_INTERPRET at call time, so nothing leaks into
other tests); with a GPU, compiled. The GPU-marked tests also run the whole engine both ways.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tpsample.model import PagedAttention, build_attention_metadata, build_paged_metadata, slot_mapping_np

PAGE = 4


@pytest.fixture
def device(monkeypatch):
    """"cuda" when there is a GPU; else "cpu" with the Triton interpreter on for this test only.
    (Triton is imported here, not at collection, so other modules' import-time settings hold.)"""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        return "cuda"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    interpret_triton_stdlib(monkeypatch)
    return "cpu"


def interpret_triton_stdlib(monkeypatch) -> None:
    """Triton's own library functions (tl.sum, tl.max, tl.cdiv, ...) were wrapped for compilation
    when triton.language was imported; the interpreter can only call interpreted ones. Swap in
    interpreted twins for this test (monkeypatch puts the originals back)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for module in (tl, tl.standard, tl.math):
        for name, obj in list(vars(module).items()):
            if isinstance(obj, JITFunction):
                monkeypatch.setattr(module, name, InterpretedFunction(obj.fn))


def _cache(num_pages: int, num_kv: int, dim: int, dtype, gen):
    k = torch.randn(num_pages * PAGE, num_kv, dim, generator=gen).to(dtype)
    v = torch.randn(num_pages * PAGE, num_kv, dim, generator=gen).to(dtype)
    return k, v


def _tables(seq_lens, num_pages: int, gen) -> np.ndarray:
    """Each sequence gets its pages from a shuffled pool (pages of a sequence are not contiguous)."""
    perm = torch.randperm(num_pages, generator=gen).numpy()
    width = max(-(-s // PAGE) for s in seq_lens)
    table, used = np.zeros((len(seq_lens), width), dtype=np.int32), 0
    for i, s in enumerate(seq_lens):
        n = -(-s // PAGE)
        table[i, :n] = perm[used:used + n]
        used += n
    return table


def _attend(q_lens, seq_lens, num_heads, num_kv, dim, dtype, device, *, kernels: bool, gen_seed=0):
    gen = torch.Generator().manual_seed(gen_seed)
    num_pages = sum(-(-s // PAGE) for s in seq_lens) + 8
    k_cache, v_cache = _cache(num_pages, num_kv, dim, dtype, gen)
    table = _tables(seq_lens, num_pages, gen)
    q = torch.randn(sum(q_lens), num_heads, dim, generator=gen).to(dtype)
    attn = PagedAttention(num_heads, num_kv, dim)
    attn.kv_cache = (k_cache.to(device), v_cache.to(device))
    _, slots = slot_mapping_np(np.array(q_lens), np.array(seq_lens), table, PAGE)
    new_k = k_cache[torch.from_numpy(slots)].to(device)   # the cache already holds them: a rewrite
    new_v = v_cache[torch.from_numpy(slots)].to(device)
    if kernels:
        decode = all(n == 1 for n in q_lens)
        meta = build_paged_metadata(q_lens, seq_lens, table, slots, PAGE, max(seq_lens), device,
                                    decode=decode, num_kv_heads=num_kv)
    else:
        meta = build_attention_metadata(q_lens, seq_lens, table, PAGE, device)
    return attn(q.to(device), new_k, new_v, meta).float().cpu()


CASES = {
    "decode_gqa": ([1, 1, 1, 1], [5, 37, 1, 64], 6, 2),
    "decode_mha": ([1, 1], [16, 29], 4, 4),
    "decode_one_kv_head": ([1, 1, 1], [3, 70, 8], 8, 1),
    "prefill_whole": ([9, 21], [9, 21], 6, 2),
    "chunked_prefill_and_decode_mixed": ([7, 1, 3, 20], [30, 12, 3, 90], 6, 2),
    "spec_decode_rows": ([4, 4], [40, 9], 4, 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_paged_kernels_equal_the_torch_path_fp32(device, name):
    q_lens, seq_lens, heads, kv_heads = CASES[name]
    ref = _attend(q_lens, seq_lens, heads, kv_heads, 16, torch.float32, "cpu", kernels=False)
    got = _attend(q_lens, seq_lens, heads, kv_heads, 16, torch.float32, device, kernels=True)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)


def test_paged_kernels_handle_a_head_dim_that_is_not_a_power_of_two(device):
    q_lens, seq_lens = [1, 5, 1], [33, 17, 64]
    ref = _attend(q_lens, seq_lens, 6, 2, 24, torch.float32, "cpu", kernels=False)
    got = _attend(q_lens, seq_lens, 6, 2, 24, torch.float32, device, kernels=True)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("q_lens, seq_lens", [([1, 1, 1], [33, 700, 64]), ([1, 5, 130], [33, 17, 300])])
def test_paged_kernels_in_bf16_stay_within_bf16_rounding_of_the_fp32_torch_path(q_lens, seq_lens):
    # GPU only: the interpreter's bf16 dot products are wrong (numpy has no bf16)
    ref = _attend(q_lens, seq_lens, 12, 2, 128, torch.float32, "cpu", kernels=False)
    got = _attend(q_lens, seq_lens, 12, 2, 128, torch.bfloat16, "cuda", kernels=True)
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("num_splits", [1, 2, 8])
def test_split_kv_decode_gives_the_same_output_for_any_split_count(device, num_splits):
    from tpsample.model.kernels import paged_decode

    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = _cache(64, 2, 16, torch.float32, gen)
    seq_lens = [50, 3, 0, 77]                               # a 0 is a padding row: output 0
    table = torch.from_numpy(_tables([max(s, 1) for s in seq_lens], 64, gen))
    q = torch.randn(4, 6, 16, generator=gen)
    args = [x.to(device) for x in (q, k_cache, v_cache, table, torch.tensor(seq_lens, dtype=torch.int32))]
    one = paged_decode(*args, page=PAGE, scale=0.25, num_splits=1).cpu()
    many = paged_decode(*args, page=PAGE, scale=0.25, num_splits=num_splits).cpu()
    torch.testing.assert_close(many, one, atol=2e-6, rtol=1e-5)
    assert many[2].abs().max() == 0


def test_fused_norm_activation_and_rope_store_equal_the_torch_layers(device):
    from tpsample.model.config import RopeConfig
    from tpsample.model.kernels import rms_norm, rope_store, silu_mul
    from tpsample.model.llama import RMSNorm, RotaryEmbedding, SiluAndMul

    gen = torch.Generator().manual_seed(1)
    x, res = torch.randn(5, 48, generator=gen), torch.randn(5, 48, generator=gen)
    norm = RMSNorm(48, 1e-6)
    norm.weight.data = torch.randn(48, generator=gen)
    ref_out, ref_res = norm(x, res)
    out, new_res = rms_norm(x.to(device), norm.weight.to(device), 1e-6, res.to(device))
    torch.testing.assert_close(out.cpu(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new_res.cpu(), ref_res)
    gate_up = torch.randn(5, 2 * 40, generator=gen)
    torch.testing.assert_close(silu_mul(gate_up.to(device)).cpu(), SiluAndMul()(gate_up), atol=1e-6, rtol=1e-5)

    rope = RotaryEmbedding(16, RopeConfig(theta=1e4, partial_rotary_factor=0.5), 64)
    qkv = torch.randn(5, (4 + 2 + 2) * 16, generator=gen)
    positions = torch.tensor([0, 3, 9, 33, 63])
    q, k, v = (t.reshape(5, -1, 16) for t in qkv.split([64, 32, 32], dim=1))
    ref_q, ref_k = rope(positions, q, k)
    work = qkv.to(device)
    wq, wk, wv = (t.view(5, -1, 16) for t in work.split([64, 32, 32], dim=1))
    k_cache, v_cache = torch.zeros(16, 2, 16, device=device), torch.zeros(16, 2, 16, device=device)
    slots = torch.tensor([4, 0, -1, 15, 7], device=device)
    rope_store(wq, wk, wv, positions.to(device), rope.cos_sin_table(64, device), slots, k_cache, v_cache)
    torch.testing.assert_close(wq.cpu(), ref_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wk.cpu(), ref_k, atol=1e-5, rtol=1e-5)
    written = [0, 1, 3, 4]                                  # token 2 has slot -1: not stored
    torch.testing.assert_close(k_cache.cpu()[[4, 0, 15, 7]], ref_k[written], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v_cache.cpu()[[4, 0, 15, 7]], v[written])
    assert k_cache.cpu().abs().sum(dim=(1, 2)).count_nonzero() == 4



def test_model_logits_through_the_kernels_equal_the_torch_path_over_prefill_chunks_and_decode(device, tmp_path):
    """A whole model over a paged cache: a prefill split in two chunks, then two decode steps, with
    shuffled pages; the kernel path's logits equal the torch path's at every step."""
    from tpsample.engine.kv_cache import allocate_kv
    from tpsample.model import TPGroup, load_model
    from tpsample.testing.toy import make_random_checkpoint

    folder = make_random_checkpoint(str(tmp_path), vocab_size=300, num_heads=6, num_kv_heads=2, hidden_size=96,
                                    init_std=0.3)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (11, 26)]
    table = _tables([40, 40], 32, gen)
    logits = {}
    for path in ("torch", "kernels"):
        dev = device if path == "kernels" else "cpu"
        model = load_model(folder, TPGroup.of(None), dtype=torch.float32, device=dev)
        allocate_kv(model, 32, PAGE, torch.float32, dev)
        steps = [([p[:6] for p in prompts]), ([p[6:] for p in prompts]), [[7], [8]], [[9], [10]]]
        done, out = [0, 0], []
        for chunk in steps:
            q_lens = np.array([len(c) for c in chunk])
            s_lens = np.array(done) + q_lens
            positions, slots = slot_mapping_np(q_lens, s_lens, table, PAGE)
            if path == "kernels":
                meta = build_paged_metadata(q_lens, s_lens, table, slots, PAGE, 64, dev,
                                            decode=bool((q_lens == 1).all()), num_kv_heads=2)
            else:
                meta = build_attention_metadata(q_lens, s_lens, table, PAGE)
            ids = torch.tensor([t for c in chunk for t in c], device=dev)
            with torch.no_grad():
                hidden = model(ids, torch.from_numpy(positions).to(dev), meta)
                out.append(model.compute_logits(hidden).cpu())
            done = s_lens.tolist()
        logits[path] = out
    # on a GPU the kernel path's fp32 GEMMs are cuBLAS's (another summation order than the CPU
    # reference's): logits of size ~10 then differ by up to ~1e-4; under the interpreter both
    # paths run on the CPU and agree far closer
    tol = 1e-4 if torch.device(device).type == "cuda" else 2e-5
    for got, ref in zip(logits["kernels"], logits["torch"]):
        torch.testing.assert_close(got, ref, atol=tol, rtol=1e-5)
