"""Column indices of the per-slot parameter tables and the per-slot feature flags."""

# dense columns (tables are [columns, slots] so a gathered column is contiguous)
T, TOP_P, MIN_P, REP, FREQ, PRES = range(6)
SEED, TOP_K, PROMPT_LEN, NUM_LP, PROCESSED, MIN_TOKENS, FLAGS = range(7)
F_BIAS, F_ALLOWED, F_STOPS, F_BAD, F_REP, F_FREQ = 1, 2, 4, 8, 16, 32
COLUMNS = {"temperature": T, "top_p": TOP_P, "min_p": MIN_P, "rep": REP, "freq": FREQ, "pres": PRES,
           "seed": SEED, "top_k": TOP_K, "prompt_len": PROMPT_LEN, "num_logprobs": NUM_LP, "processed": PROCESSED,
           "min_tokens": MIN_TOKENS, "flags": FLAGS}
