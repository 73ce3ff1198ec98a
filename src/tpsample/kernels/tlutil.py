"""Small Triton device helpers shared by the kernels: row transform, keys, masses, argmax pairs,
per-lane PTX, and the noise's Triton twin.

Every helper is `@triton.jit` and uses core `tl` ops only (the CPU interpreter runs them), except
`fexp`, which picks libdevice's `expf` when EXACT_EXP is set (GPU only): torch's CUDA `exp` is
that same routine, so masses then match torch on the GPU bit for bit; `tl.exp` lowers to the
faster `ex2.approx`, within a few ulps. Likewise `count_where`, `claim_where`, `store_where`,
`store_pair_where`, `ex2_ftz` and `opaque_u32` run inline PTX when their PTX flag is set
(compiled for CUDA), else `tl.atomic_add` / `tl.store` / core ops. The PTX of the atomics and
stores runs in every thread that holds an entry: a vector with fewer entries than the program
has threads repeats entries over threads, and must take the core ops (`launch.lane_ptx`).

The noise twin of `tpsample.noise` (`uniform_bits`, `gumbel_from_bits`, `gumbel`): for key0 /
key1 (uint32) and global token ids, `uniform_bits` returns exactly the u of `noise.uniform_bits`
(native uint32 arithmetic wraps mod 2**32, which is what the torch version emulates with 16-bit
halves), and `gumbel_from_bits` evaluates the same fp32 formula g = -log(-log1p(-W)),
W = min((u + 1/2) * 2**-32, 1 - 2**-24), with log1p by Goldberg's identity and IEEE
round-to-nearest divisions (`tl.div_rn`, never the approximate `/`). u is identical everywhere;
g is identical wherever `log` is: on NVIDIA GPUs `tl.log` lowers to libdevice `__nv_logf`, the
same routine torch's CUDA `log` calls; the CPU paths (torch on CPU, the interpreter's numpy) may
differ from it in the last ulp.
"""
import triton
import triton.language as tl

try:  # libdevice's functions are stubs the interpreter cannot run; only used when EXACT_EXP
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - very old Triton
    libdevice = None


NEG_INF = tl.constexpr(float("-inf"))
KEY_NEG_INF = tl.constexpr(0x007FFFFF)     # order_key(-inf)
KEY_POS_INF = tl.constexpr(0xFF800000)     # order_key(+inf)
BIG_ID32 = tl.constexpr(0x7FFFFFFF)        # a local column id larger than any real one (ties -> lowest id)


@triton.jit
def load_x(x_ptr, row_off, cols, mask):
    """Columns `cols` of a row upcast to fp32, NaN -> -inf (masked lanes: -inf)."""
    x = tl.load(x_ptr + row_off + cols, mask=mask, other=NEG_INF).to(tl.float32)
    return tl.where(x == x, x, NEG_INF)        # noqa: PLR0124 - a NaN test


@triton.jit
def div_t(x, t):
    """l = x / T with IEEE round-to-nearest division (the plain `/` is approximate on GPU)."""
    return tl.div_rn(x, tl.zeros_like(x) + t)


@triton.jit
def div_by(x, t, y):
    """x / T with one multiply and two FMAs, given y = div_rn(1, T): Markstein's correction
    q0 = x * y, r = fma(-q0, T, x) (exact), q = fma(r, y, q0) gives IEEE round-to-nearest x / T
    when y is the correctly rounded 1 / T and nothing over- or underflows, i.e. for
    2**-100 <= |x| <= 2**100 and 2**-20 <= T <= 2**20 (and x = 0). No per-entry reciprocal and no
    slow-path branch, which is what `div_t`'s division costs per entry. Outside that range the
    result is near x / T, or NaN for infinite x: callers use it only where that cannot change
    what they compute (`lists.fast_division_ok`)."""
    q0 = x * y
    r = tl.fma(-q0, tl.zeros_like(x) + t, x)
    return tl.fma(r, tl.zeros_like(x) + y, q0)


@triton.jit
def order_key(l):
    """uint32 key, larger float -> larger key; -0.0 keyed as +0.0 (callers exclude NaN)."""
    l = tl.where(l == 0.0, 0.0, l)
    bits = l.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) == 0, bits ^ 0x80000000, ~bits)


@triton.jit
def key_to_float(key):
    """Inverse of `order_key` for an int64 or uint32 key."""
    k = key.to(tl.uint32)
    bits = tl.where((k >> 31) == 1, k ^ 0x80000000, ~k)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def fexp(x, EXACT_EXP: tl.constexpr):
    if EXACT_EXP:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def mass(l, m, scale, one, EXACT_EXP: tl.constexpr):
    """e = trunc(exp(l - m) * 2**shift) as int64, exp(0) taken as 1 (`one` = 2**shift,
    `scale` = the same as fp32); 0 for l = -inf. Callers mask dropped entries."""
    ex = fexp(tl.where(l > NEG_INF, l - m, NEG_INF), EXACT_EXP)
    e = tl.where(l == m, one, (ex * scale).to(tl.int64))
    return tl.where(l > NEG_INF, e, 0)


@triton.jit
def kept_mass(l, keep, m, scale, EXACT_EXP: tl.constexpr):
    """`mass(l)` where `keep`, else 0, for a row whose max m is finite, with the tests and the
    select on fp32 and one int64 conversion (the streaming passes pay per entry): exp(-inf - m)
    is 0 and exp(l - m) for l = m is exp(0) = 1 (2**shift after the scale), with no guards,
    and a NaN l must fail `keep` (a comparison with it does)."""
    return (tl.where(keep, fexp(l - m, EXACT_EXP), 0.0) * scale).to(tl.int64)


@triton.jit
def claim_slots(line, sel, LG: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """List slots for the lanes where `sel` (int32 0 / 1; other lanes: any value), in PTX (CUDA
    only), one atomic for every 4 entries of a thread: the thread appends through counter
    g = laneid % LG (int32 words GROUP_WORDS apart from `line`), its selected entries take
    consecutive places i of group g, and place i is slot i * LG + g. The 32 lanes of a warp
    spread over the LG counters whatever the register layout; which 4 entries one atomic covers
    does not matter. The caller's block must hold a multiple of 4 entries a thread."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred q; .reg .b32 g, n, b, c; .reg .b64 a; "
        "mov.u32 g, %laneid; and.b32 g, g, $12; mad.wide.u32 a, g, $16, $4; "
        "add.u32 n, $8, $9; add.u32 n, n, $10; add.u32 n, n, $11; setp.ne.u32 q, n, 0; mov.u32 b, 0; "
        "@q atom.relaxed.gpu.global.add.u32 b, [a], n; add.u32 c, $12, 1; "
        "mad.lo.u32 $0, b, c, g; add.u32 b, b, $8; mad.lo.u32 $1, b, c, g; "
        "add.u32 b, b, $9; mad.lo.u32 $2, b, c, g; add.u32 b, b, $10; mad.lo.u32 $3, b, c, g; }",
        "=r,=r,=r,=r,l,l,l,l,r,r,r,r,r,r,r,r,r,r,r,r",
        [line + tl.zeros_like(sel), sel, tl.zeros_like(sel) + (LG - 1), tl.zeros_like(sel) + GROUP_WORDS * 4],
        dtype=tl.int32, is_pure=False, pack=4)


@triton.jit
def count_where(base, idx, mask, PTX: tl.constexpr):
    """base[idx] += 1 (int32, relaxed, no result) in every lane where `mask` (idx >= 0 there;
    base one pointer for every lane). PTX (CUDA only): one predicated `red` per lane, an
    elementwise op that keeps the operands' register layout, its address formed in the asm;
    `tl.atomic_add` instead branches around each lane's atomic and, being a memory op, takes its
    own layout (a shuffle through shared memory per step of a streaming pass)."""
    if PTX:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b64 a; setp.ne.b32 p, $3, 0; mad.wide.u32 a, $2, 4, $1; "
            "@p red.relaxed.gpu.global.add.u32 [a], 1; mov.u32 $0, 0; }",
            "=r,l,r,r", [base, idx, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.atomic_add(base + idx, 1, mask=mask, sem="relaxed")


@triton.jit
def claim_where(ptrs, mask, PTX: tl.constexpr):
    """The old value of *ptr (int32) after *ptr += 1 where `mask`, 0 elsewhere (relaxed); PTX as
    in `count_where`."""
    if PTX:
        old = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.u32 $0, 0; @p atom.relaxed.gpu.global.add.u32 $0, [$1], 1; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        old = tl.atomic_add(ptrs, 1, mask=mask, sem="relaxed")
    return old


# `store_where`'s PTX: an int32 and an int64 store (the offset idx * 4 or idx * 8)
_STORE_B32 = tl.constexpr("{ .reg .pred p; .reg .b64 a; setp.ne.b32 p, $4, 0; mad.wide.u32 a, $2, 4, $1; "
                          "@p st.global.b32 [a], $3; mov.u32 $0, 0; }")
_STORE_B64 = tl.constexpr("{ .reg .pred p; .reg .b64 a; setp.ne.b32 p, $4, 0; mad.wide.u32 a, $2, 8, $1; "
                          "@p st.global.b64 [a], $3; mov.u32 $0, 0; }")


@triton.jit
def store_where(base, idx, values, mask, PTX: tl.constexpr):
    """base[idx] = value (int32, or int64 where base points to 64-bit words) where `mask` (idx >= 0
    there); PTX as in `count_where` (a scattered store is a memory op with a layout of its own
    too; Triton's scattered int64 store kept every lane's address and value alive at once, +67
    registers a thread in the list kernel)."""
    if PTX:
        wide: tl.constexpr = base.dtype.element_ty.primitive_bitwidth == 64
        tl.inline_asm_elementwise(
            _STORE_B64 if wide else _STORE_B32, "=r,l,r,l,r" if wide else "=r,l,r,r,r",
            [base, idx, values.to(tl.int64 if wide else tl.int32), mask.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1)
    else:
        tl.store(base + idx, values, mask=mask)


@triton.jit
def ex2_ftz(z, PTX: tl.constexpr):
    """2**z, fast: PTX `ex2.approx.ftz` (CUDA only; relative error ~2**-22, subnormal results
    flushed to 0), else `tl.exp2`."""
    if PTX:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [z], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(z)


@triton.jit
def opaque_u32(v, PTX: tl.constexpr):
    """v, hidden from the compiler's algebra on CUDA (a PTX move): else it folds
    offs * GOLDEN + s * GOLDEN back into (offs + s) * GOLDEN, a multiply an entry again."""
    if PTX:
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return v


@triton.jit
def opaque_f64(v, PTX: tl.constexpr):
    """v (float64), hidden from the compiler on CUDA (a PTX move), so that a product it holds
    is rounded on its own and never fused with a later add into an FMA: float64 formulas
    written to match torch's operation by operation keep their roundings."""
    if PTX:
        return tl.inline_asm_elementwise("mov.b64 $0, $1;", "=d,d", [v], dtype=tl.float64, is_pure=True, pack=1)
    else:
        return v


@triton.jit
def store_pair_where(base_a, base_b, idx, va, vb, mask, PTX: tl.constexpr):
    """base_a[idx] = va and base_b[idx] = vb (int32) where `mask` (idx >= 0 there): two
    `store_where`s sharing one offset idx * 4 (PTX: one wide multiply and two 64-bit adds for
    both addresses, where two `mad.wide`s took eight instructions an entry on sm_90)."""
    if PTX:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b64 a, b, o; setp.ne.b32 p, $6, 0; mul.wide.u32 o, $3, 4; add.s64 a, $1, o; "
            "add.s64 b, $2, o; @p st.global.b32 [a], $4; @p st.global.b32 [b], $5; mov.u32 $0, 0; }",
            "=r,l,l,r,r,r,r", [base_a, base_b, idx, va.to(tl.int32), vb.to(tl.int32), mask.to(tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.store(base_a + idx, va, mask=mask)
        tl.store(base_b + idx, vb, mask=mask)


@triton.jit
def pair_max(v1, i1, v2, i2):
    """Combine for (value, id) pairs: larger value, ties -> lower id."""
    take2 = (v2 > v1) | ((v2 == v1) & (i2 < i1))
    return tl.where(take2, v2, v1), tl.where(take2, i2, i1)


@triton.jit
def argmax_pair(v, ids):
    """(max, lowest id attaining it) of a 1-D or 2-D block (NaN-free; ids int32).

    Two plain reductions rather than one tuple reduce: as fast on GPU, and the interpreter
    runs plain reductions in numpy instead of calling a combine function per element."""
    if len(v.shape) == 2:
        mx = tl.max(tl.max(v, axis=1), axis=0)
        return mx, tl.min(tl.min(tl.where(v == mx, ids, BIG_ID32), axis=1), axis=0)
    else:
        mx = tl.max(v, axis=0)
        return mx, tl.min(tl.where(v == mx, ids, BIG_ID32), axis=0)


@triton.jit
def chunk_bounds(ncols, CHUNK: tl.constexpr):
    """Columns [start, end) of this program's split of the row (program_id(1))."""
    start = tl.program_id(1) * CHUNK
    return start, tl.minimum(start + CHUNK, ncols)


GOLDEN = tl.constexpr(0x9E3779B1)
W_MAX = tl.constexpr(0.99999994039535522)  # 1 - 2**-24, exact in fp32
TWO_POW_M32 = tl.constexpr(2.3283064365386963e-10)  # 2**-32, exact in fp32


@triton.jit
def fmix32(x):
    """Murmur3's 32-bit finaliser on uint32 (multiplications wrap mod 2**32)."""
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def uniform_bits(key0, key1, token_ids):
    """u (uint32) for row keys key0, key1 (uint32) and global token ids (any int type)."""
    return uniform_bits_spread(key0, key1, token_ids.to(tl.uint32) * GOLDEN)


@triton.jit
def uniform_bits_spread(key0, key1, spread):
    """`uniform_bits` given spread = token id * GOLDEN (uint32, mod 2**32): a streaming pass
    forms it as (step's first id) * GOLDEN + (lane offset * GOLDEN, loop-invariant), one add
    an entry, since the product distributes over the sum mod 2**32."""
    x = fmix32(key0 ^ spread)
    return fmix32(x ^ key1)


@triton.jit
def neg_log1p_neg(w):
    """-log1p(-w) for w in (0, 1): Goldberg's identity, exactly as `noise.neg_log1p_neg`."""
    y = 1.0 - w
    d = 1.0 - y
    safe = tl.where(d == 0.0, 1.0, d)
    return tl.where(d == 0.0, w, -tl.log(y) * tl.div_rn(w, safe))


@triton.jit
def gumbel_from_bits(u):
    """Standard Gumbel noise (fp32) from uint32 bits, the formula of `noise.gumbel_from_bits`."""
    w = (u.to(tl.float32) + 0.5) * TWO_POW_M32
    w = tl.minimum(w, W_MAX)
    return -tl.log(neg_log1p_neg(w))


@triton.jit
def gumbel(key0, key1, token_ids):
    """g(key, id): the draw noise for global token ids."""
    return gumbel_from_bits(uniform_bits(key0, key1, token_ids))


@triton.jit
def may_win(l, u, best_v):
    """False only where fp32(l' + g(u)) < best_v for every l' within 3 ulp of l (so l may be
    x / T itself or x * (1 / T)): the noise then cannot lift the entry to the best so far.
    g = -log(-log1p(-W)) <= -log W, and W >= W' = (u >> 9) * 2**-23 (W' has only u's bits: no
    conversion), so a winner has W' <= exp(l - best_v + margin); the margin covers the fp32
    roundings of g, of the sum and of l, and the fast exp. l below -FLT_MAX (overflowed) is
    taken as -FLT_MAX, within that margin; best_v = -inf passes everything."""
    l = tl.maximum(l, -3.4028234663852886e38)
    w_lo = ((u >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 1.0
    return w_lo <= tl.exp(l - best_v + (1e-3 + 2e-6 * (tl.abs(l) + tl.abs(best_v))))


# ---- exact searches over a row's candidate keys --------------------------------------------
# keys the search for v* settles at once, pairwise (`min_key_mass_few`), and the int32
# words of its scratch (2 * FEW + 1 int64 words) at the start of a row's hist words
SEARCH_FEW = 32
SCRATCH_WORDS = 4 * SEARCH_FEW + 2
FEW = tl.constexpr(SEARCH_FEW)


@triton.jit
def bisection_steps(d):
    """The halvings that take an integer interval of size d >= 1 down to 1: d's bit length (exact
    through float64 for d < 2**53), as int32; 33, the full key range's count, when d < 1."""
    e = (d.to(tl.float64).to(tl.int64, bitcast=True) >> 52) & 0x7FF
    return tl.where(d >= 1, e - 1022, 33).to(tl.int32)


@triton.jit
def max_key_with_count(keys, valid, k):
    """Largest key kappa with #(valid keys >= kappa) >= k, by bisection (keys int64 in [0, 2**32);
    the caller ensures at least k valid keys). The search starts from the valid keys' own range
    and takes only the steps it needs (the same kappa as over [0, 2**32): it is the k-th largest
    key), else from the whole range."""
    kmin = tl.min(tl.where(valid, keys, 1 << 32), axis=0)
    kmax = tl.max(tl.where(valid, keys, -1), axis=0)
    narrow = (k >= 1) & (tl.sum(valid.to(tl.int32), axis=0) >= k)
    lo = tl.where(narrow, kmin, 0)
    hi = tl.where(narrow, kmax + 1, 1 << 32)
    for _ in range(bisection_steps(hi - lo)):    # a fixed count: a reduction inside a while loop raced on Triton 3.6
        mid = (lo + hi) >> 1
        ok = tl.sum((valid & (keys >= mid)).to(tl.int32), axis=0) >= k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return lo


@triton.jit
def min_key_mass_below(keys, e, base, target, lo, hi):
    """Smallest kappa in (lo, hi] with float64(base + sum(e where keys > kappa)) < target, by
    bisection; the caller ensures it holds at hi and fails at lo (masses int64, exact sums). It
    takes the bit length of hi - lo steps (a bracket's candidates span a few bins: ~15 instead of
    the full key range's 33), after which lo + 1 == hi."""
    for _ in range(bisection_steps(hi - lo)):
        mid = (lo + hi) >> 1
        ok = (base + tl.sum(tl.where(keys > mid, e, 0), axis=0)).to(tl.float64) < target
        hi = tl.where(ok, mid, hi)
        lo = tl.where(ok, lo, mid)
    return hi


@triton.jit
def min_key_mass_few(keys, e, base, target, lo, hi, n_lo, scratch, FEW: tl.constexpr, PTX: tl.constexpr):
    """`min_key_mass_below`'s kappa (the same value) in fewer reductions, for keys int64 in
    [0, 2**32) with -1 for a non-candidate (e 0 there) and none above hi; n_lo = #(keys > lo).
    It bisects only while more than FEW keys lie in (lo, hi] (a count beside each step's mass),
    then settles kappa among those keys at once: kappa is the smallest of them, c, with
    float64(f(c)) < target, f(c) = f(hi) + the mass of those above c (the largest one passes, as
    f(hi) does; there is one, as f(hi) < target <= f(lo)). They are gathered in `scratch`
    (2 * FEW + 1 int64 words of the program's, free once every warp has passed the caller's last
    reduction) through a counter there (`claim_where` and `store_where`, PTX as there: fewer
    registers than Triton's own scattered int64 stores). Rows whose candidates crowd one key
    range (ties) bisect to lo + 1 == hi as before."""
    f_hi = base
    n_hi = tl.zeros((), tl.int32)
    for _ in range(bisection_steps(hi - lo)):    # a fixed count (see `max_key_with_count`)
        if n_lo - n_hi > FEW:
            mid = (lo + hi) >> 1
            above = keys > mid
            f = base + tl.sum(tl.where(above, e, 0), axis=0)
            n = tl.sum(above.to(tl.int32), axis=0)
            ok = f.to(tl.float64) < target
            hi = tl.where(ok, mid, hi)
            f_hi = tl.where(ok, f, f_hi)
            n_hi = tl.where(ok, n, n_hi)
            lo = tl.where(ok, lo, mid)
            n_lo = tl.where(ok, n_lo, n)
    thr = hi
    if hi - lo > 1:
        n = n_lo - n_hi
        inb = (keys > lo) & (keys <= hi)
        counter = (scratch + 2 * FEW).to(tl.pointer_type(tl.int32))
        tl.store(counter, 0)
        tl.debug_barrier()       # (and every warp is past the caller's reads of the scratch)
        pos = claim_where(counter + tl.zeros_like(inb.to(tl.int32)), inb, PTX)
        store_where(scratch, pos, keys, inb, PTX)
        store_where(scratch + FEW, pos, e, inb, PTX)
        tl.debug_barrier()
        j = tl.arange(0, FEW)
        cj = tl.load(scratch + j, mask=j < n, other=-1)
        ej = tl.load(scratch + FEW + j, mask=j < n, other=0)
        f = f_hi + tl.sum(tl.where(cj[None, :] > cj[:, None], ej[None, :], 0), axis=1)
        good = (j < n) & (f.to(tl.float64) < target)
        thr = tl.min(tl.where(good, cj, hi), axis=0)
    return thr
