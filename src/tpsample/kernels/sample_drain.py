"""drain_kernel: finishes, in one launch, every row the first round left searching.

One program per row runs the row's remaining rounds back to back (each split's pass of
`round_body`, then `finish_body`) until the row is DONE, so `sample_rows` never has to ask the
host whether another round is needed: no device-to-host read, no synchronisation, and the launch
sequence is fixed (CUDA-graph capturable). Rows already DONE return at once. A row's later rounds
read the row once per pass from one program, which is slower than the multi-program rounds for a
single row but needs no host round trip; only rows whose candidates overflowed or whose top-p
bracket did not certify (large top-k, pathological ties) get here.
"""
import triton
import triton.language as tl

from .sample_finish import finish_body
from .sample_rounds import round_body
from .sample_state import DONE


@triton.jit(do_not_specialize=["col_offset"])
def drain_kernel(x_ptr, stride, ncols, t_ptr, k_ptr, p_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                 st_stage, st_flags, st_token, st_valid, st_raw, st_m, st_t1, st_tkey, st_klo, st_khi, st_shift,
                 st_cabove, st_mabove, st_S, st_piv, cand_key, cand_id, cand_n,
                 p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist, st_hlo, st_hinv, st_first, st_last, st_count,
                 fallbacks, st_xf, st_lean_l, ids_ptr, leans,
                 NSPLIT: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                 SMALL: tl.constexpr, P: tl.constexpr, NB: tl.constexpr, EXACT_EXP: tl.constexpr,
                 MAX_ROUNDS: tl.constexpr, NBH: tl.constexpr):
    """Stages 1-4 only (COLLECT, DRAW, HIST): BRACKET and LEAN rows are settled by the first
    round's finish (DONE, or HIST when they fall back)."""
    row = tl.program_id(0)
    stage = tl.load(st_stage + row)
    it = 0
    while (stage != DONE) & (it < MAX_ROUNDS):
        for split in range(NSPLIT):
            round_body(row, split, x_ptr, stride, ncols, t_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                       st_stage, st_flags, st_m, st_tkey, st_klo, st_khi, st_shift, st_piv,
                       cand_key, cand_id, cand_n, p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist,
                       st_hlo, st_hinv, st_first, st_last, st_count, st_xf, ids_ptr, NSPLIT, CHUNK, BLOCK, CAP, P, NB,
                       EXACT_EXP, 7, NBH, 1, BLOCK, 1)
        tl.debug_barrier()
        stage = finish_body(row, ncols, k_ptr, p_ptr, key0_ptr, key1_ptr, col_offset, scale, one,
                            st_stage, st_flags, st_token, st_valid, st_raw, st_m, st_t1, st_tkey, st_klo, st_khi,
                            st_shift, st_cabove, st_mabove, st_S, st_piv, cand_key, cand_id, cand_n,
                            p_best_v, p_best_i, p_cnt, p_mass, p_cgt, p_mgt, p_hist, st_count, fallbacks,
                            x_ptr, stride, t_ptr, st_hlo, st_hinv, st_last, st_lean_l, ids_ptr, leans,
                            NSPLIT, CAP, SMALL, P, NB, EXACT_EXP, 7, 1, 16, NBH, 1)
        tl.debug_barrier()
        it += 1
    if stage != DONE:        # cannot happen (the search narrows every round); flag, never hang
        tl.store(st_token + row, tl.load(st_raw + row).to(tl.int64) + col_offset)
        tl.store(st_valid + row, False)
