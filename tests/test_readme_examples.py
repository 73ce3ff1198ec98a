"""The README's Python examples run as written, and give what their comments say."""
from __future__ import annotations

import contextlib
import io
import pathlib
import re

import torch

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> dict[str, str]:
    """The README's ```python blocks, keyed by the section (## heading) each sits in."""
    blocks, section = {}, None
    for part in re.split(r"^(## .*)$", README.read_text(), flags=re.MULTILINE):
        if part.startswith("## "):
            section = part[3:].strip()
        else:
            for code in re.findall(r"```python\n(.*?)```", part, flags=re.DOTALL):
                blocks[section] = code
    return blocks


def run(code: str) -> tuple[dict, str]:
    namespace: dict = {"__name__": "readme_example"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), namespace)
    return namespace, printed.getvalue()


def test_every_python_example_of_the_readme_is_checked_here():
    assert set(python_blocks()) == {"The `Sampler`", "Inside an engine: `tpsample.ops`"}


def test_the_sampler_example_samples_one_token_in_the_vocabulary():
    ns, printed = run(python_blocks()["The `Sampler`"])
    assert len(ns["out"].tokens(0)) == 1 and 0 <= ns["out"].tokens(0)[0] < ns["V"]
    assert printed.strip()


def test_the_ops_example_samples_each_row_with_its_own_parameters():
    ns, printed = run(python_blocks()["Inside an engine: `tpsample.ops`"])
    out, logits = ns["out"], ns["logits"]
    assert out.token_ids.shape == (4,) and bool(((out.token_ids >= 0) & (out.token_ids < logits.shape[1])).all())
    assert out.token_ids[0] == logits[0].argmax()                      # row 0 is greedy (temperature 0)
    assert out.logprobs.logprobs.shape == (4, 3) and torch.equal(out.logprobs.token_ids[:, 0], out.token_ids)
    assert printed.strip()
