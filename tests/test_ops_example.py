"""examples/ops_decode_loop.py runs, and its tokens are reproducible from the seeds and do not
depend on which requests share the batch."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import pathlib

import pytest

pytest.importorskip("transformers")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "ops_decode_loop.py"


def run(*argv: str) -> dict:
    spec = importlib.util.spec_from_file_location("ops_decode_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with contextlib.redirect_stdout(io.StringIO()):
        return module.main(list(argv))


def test_example_decodes_reproducibly_and_independently_of_the_batch():
    steps = 6
    full = run("--steps", str(steps))
    assert set(full) == {"greedy", "plain", "top_k", "top_p"}
    assert all(len(toks) == steps and all(0 <= t < 384 for t in toks) for toks in full.values())
    assert run("--steps", str(steps)) == full                                  # same seeds, same tokens
    for alone in ("plain", "top_p"):                                            # a request alone
        assert run("--steps", str(steps), "--only", alone) == {alone: full[alone]}
    assert run("--steps", str(steps), "--only", "top_k", "greedy") == {"greedy": full["greedy"], "top_k": full["top_k"]}
    other = run("--steps", str(steps), "--seed-offset", "1")                   # other seeds: other draws
    assert other["greedy"] == full["greedy"]
    assert any(other[k] != full[k] for k in ("plain", "top_k", "top_p"))
