"""What only the vocab_parallel strategy uses: the shard rounds (`split_rows`), their logprobs
(`split_logprobs`), the per-shard row summaries (`summary`), the top-p band method
(`topp_band`, `topp_band_lp`) and the packing of a round's partial results into one
collective (`packing`). Built on `tpsample.sampling`'s processors, filters and draws; the
single-rank pipeline never imports this package."""
