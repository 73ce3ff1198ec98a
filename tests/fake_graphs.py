"""CUDA graphs stood in for on CPU, so `Sampler.capture` and its replays run on CPU tensors.

`install(monkeypatch)` patches torch.cuda for the test: a capture records its step by running it
once and undoing what it wrote to the history (a real capture records without running), and a
replay runs the recorded step again. The host flow of capture and replay is the real one; the
frozen shapes and pointers of a real graph are tested on a GPU (test_sampler_cuda.py). Returns
the list of `History.full_views` values seen at each capture.
"""
from __future__ import annotations

import contextlib

import torch

from tpsample import replay as capture


class FakeGraph:
    def __init__(self):
        self.step = None

    def replay(self):
        self.step._record()


def install(monkeypatch) -> list:
    full_views = []
    record = capture.CapturedStep._record

    def recorded(self):
        if self.graph.step is not None:       # a replay
            record(self)
            return
        self.graph.step = self                # the capture: run once, then undo the history append
        h = self.sampler.store.history
        full_views.append(h.full_views)
        saved = h.tokens.clone(), h.ordered.clone(), h.num_out.clone()
        record(self)
        h.tokens.copy_(saved[0]), h.ordered.copy_(saved[1]), h.num_out.copy_(saved[2])

    monkeypatch.setattr(capture, "_require_cuda", lambda logits: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: contextlib.nullcontext())
    monkeypatch.setattr(capture.CapturedStep, "_record", recorded)
    return full_views
