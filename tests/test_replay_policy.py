"""The one recording policy of `tpsample.replay`, as the ops' launch lists follow it: a site
whose recordings are refused is recorded again up to RECORD_TRIES times, then launched eagerly
for good; a call whose inputs share memory is never recorded. No kernel is needed: a launch
that does torch work is what a launch list refuses."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tpsample import replay


def _torch_step(out: torch.Tensor, recorded: list):
    def launch():
        recorded.append(_get_current_dispatch_mode() is not None)   # inside a recording?
        out.copy_(out + 1)                                           # device work outside the kernels
    return launch


def test_a_site_refused_record_tries_times_launches_eagerly_for_good():
    sites: dict = {}
    x, out = torch.zeros(4), torch.zeros(4)
    recorded: list = []
    calls = replay.RECORD_TRIES + 3
    for _ in range(calls):
        replay.launch_at(sites, "site", [x, out], 1, _torch_step(out, recorded))
    assert recorded == [True] * replay.RECORD_TRIES + [False] * 3
    assert sites == {"site": replay.RECORD_TRIES}
    assert out.tolist() == [calls] * 4          # every call launched once, recorded or not


def test_a_call_whose_inputs_share_memory_is_never_recorded():
    sites: dict = {}
    x, out = torch.zeros(4), torch.zeros(4)
    recorded: list = []
    for _ in range(2):
        replay.launch_at(sites, "site", [x, x, out], 2, _torch_step(out, recorded))
    assert recorded == [False, False] and sites == {}


def test_record_launches_names_device_work_outside_the_kernels():
    out = torch.zeros(3)
    result, launches, why = replay.record_launches("cpu", [out], lambda: (out + 2).sum())
    assert launches is None and why == "device work outside the kernels (add, sum)"
    assert float(result) == 6.0
