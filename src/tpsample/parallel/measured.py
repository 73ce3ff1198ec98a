"""The sampler's `auto` policy: measured costs per feature class, a static model before them.

`MeasuredAuto.choose` runs at plan time (no communication): with the step's feature class
measured it applies `auto.choose` to the agreed numbers, else the static constants of the device
kind. `MeasuredAuto.ensure` runs inside `Sampler.sample` (every rank calls it at the same step,
with the same plan): the first time a feature class is seen it measures it, and the group once
(`calibrate.py`), then agrees on the numbers with one all-reduce. Rank-identical by construction:
the numbers every rank holds are the same, and so is the order in which classes get measured.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np
import torch

from . import auto, calibrate
from .collectives import Collectives
from .group import TPGroup


class MeasuredAuto:
    def __init__(self, group: TPGroup, vocab_size: int):
        self.group, self.vocab_size = group, vocab_size
        self.width = math.ceil(vocab_size / group.size)
        self.comm: Optional[auto.CommCosts] = None
        self.steps: dict[auto.Features, auto.StepCosts] = {}
        self.version = 0                    # bumped whenever a class gets measured
        self.calibration_s = 0.0            # wall time spent measuring so far

    def costs(self, f: auto.Features, device_type: str):
        """(CommCosts, StepCosts, measured?) for a feature class."""
        if self.comm is not None and f in self.steps:
            return self.comm, self.steps[f], True
        return (*auto.static_costs(device_type, f), False)

    def choose(self, f: auto.Features, rows: int, owner_rows: int, device_type: str) -> str:
        if self.group.size == 1:
            return "replicated"
        comm, local, _ = self.costs(f, device_type)
        return auto.choose(rows, owner_rows, self.vocab_size, self.group.size, f, comm, local)

    def estimates(self, f: auto.Features, rows: int, owner_rows: int, device_type: str) -> dict[str, float]:
        comm, local, _ = self.costs(f, device_type)
        return auto.estimates(rows, owner_rows, self.vocab_size, self.group.size, f, comm, local)

    def ensure(self, f: auto.Features, device: torch.device) -> None:
        """Measure this class (and the group, the first time) unless known; collective."""
        if self.group.size == 1 or (self.comm is not None and f in self.steps):
            return
        t0 = time.perf_counter()
        comm = Collectives(self.group)
        comm_costs = self.comm or calibrate.measure_comm(comm, device)
        step = calibrate.measure_class(f, self.vocab_size, comm, device)
        self.comm, self.steps[f] = calibrate.agree(comm, comm_costs, step, device)
        self.version += 1
        self.calibration_s += time.perf_counter() - t0


def features(store, slots: np.ndarray, drafts: bool) -> auto.Features:
    """The feature class of some requests (slots) from their per-slot host parameters."""
    f, i = store.layout.f32, store.layout.i64
    f32, i64 = store.f32.host[:, slots], store.i64.host[:, slots]
    return auto.Features.of(f32[f["temperature"]], i64[i["top_k"]], f32[f["top_p"]], f32[f["min_p"]],
                            i64[i["num_logprobs"]], i64[i["processed"]], drafts)
