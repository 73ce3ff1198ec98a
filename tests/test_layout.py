"""`import tpsample` loads the sampler only: the engine, the model and their dependencies load
on first use of `tpsample.LLM` (or `RequestOutput`, `GuidedDecoding`)."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("tpsample.engine", "tpsample.model", "tpsample.llm", "tpsample.cli", "safetensors", "transformers",
         "xgrammar", "matplotlib")

PROBE = """
import json, sys
import tpsample
before = sorted({m.split('.')[0] if not m.startswith('tpsample.') else '.'.join(m.split('.')[:2])
                 for m in sys.modules})
llm = tpsample.LLM
print(json.dumps({"before": before, "llm": f"{llm.__module__}.{llm.__name__}",
                  "lazy": [tpsample.RequestOutput.__module__, tpsample.GuidedDecoding.__module__],
                  "after_engine": "tpsample.engine" in sys.modules}))
"""


def test_import_tpsample_loads_the_sampler_and_the_engine_only_on_first_use():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    loaded = [m for m in HEAVY if m in got["before"]]
    assert loaded == [], f"import tpsample loaded {loaded}"
    assert "tpsample.sampler" in got["before"]
    assert got["llm"] == "tpsample.llm.LLM" and got["after_engine"]
    assert got["lazy"] == ["tpsample.engine.request", "tpsample.engine.request"]
