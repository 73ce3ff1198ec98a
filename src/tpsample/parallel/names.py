"""The strategy names, in one place (no imports: every layer may use them).

FIXED: the three strategies; ALL: every name a user may pass, "auto" first; REPORT_ORDER: the
order tables and demos list them in (the fixed ones, then auto).
"""
FIXED = ("replicated", "batch_sharded", "vocab_parallel")
ALL = ("auto", *FIXED)
REPORT_ORDER = (*FIXED, "auto")
