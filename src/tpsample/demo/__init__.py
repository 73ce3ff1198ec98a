"""`tpsample demo`: the sampler part (`demo.sampler`) and the engine part (`demo.engine`)."""
