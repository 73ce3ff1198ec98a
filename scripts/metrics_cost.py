"""What scraping /metrics costs the decode loop: `tpsample serve` in its own process under a
steady load of 8 streaming clients (`tpsample bench serve --url`, another process), while this
script alternates phases without scraping, scraping once a second (Prometheus scrapes every 15 s
by default) and 20 times a second. Per phase: the mean inter-token latency (the engine's step
stamps, from the /metrics histogram read at the phase's ends) and the output tokens/s.
    python scripts/metrics_cost.py [MODEL_DIR] [--phase-s 10] [--rounds 4]
Without a model, a small random chat checkpoint is made in a temporary folder. Prints one line
per phase, a table, and ends with one JSON line."""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

MODES = {"off": None, "1 Hz": 1.0, "20 Hz": 0.05}


def start_server(model: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tpsample.cli", "serve", model, "--dtype", "float32",
                             "--kv-cache-tokens", "8192", "--max-num-seqs", "16", "--port", "0",
                             "--served-model-name", "bench", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True)
    while not (m := re.search(r"(http://[\d.]+:\d+)/v1", proc.stderr.readline())):
        if proc.poll() is not None:
            raise RuntimeError("the server did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, m.group(1)


def itl_and_tokens(client: httpx.Client, url: str) -> tuple[float, float, float]:
    v = {s.name: s.value for f in text_string_to_metric_families(client.get(url + "/metrics").text)
         for s in f.samples}
    return (v["vllm:inter_token_latency_seconds_sum"], v["vllm:inter_token_latency_seconds_count"],
            v["vllm:generation_tokens_total"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?")
    p.add_argument("--phase-s", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    model = args.model
    if model is None:
        from tpsample.testing.toy import make_chat_checkpoint

        model = make_chat_checkpoint(tempfile.mkdtemp(), hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                                     intermediate_size=512)
    server, url = start_server(model)
    total = args.phase_s * args.rounds * len(MODES) + 10
    load = subprocess.Popen([sys.executable, "-m", "tpsample.cli", "bench", "serve", "--url", url, "--clients", "8",
                             "--duration", str(total), "--max-tokens", "32"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client, rows = httpx.Client(timeout=30), {mode: [] for mode in MODES}
    try:
        time.sleep(5)
        for r in range(args.rounds):
            for mode, every in MODES.items():
                s0, c0, g0 = itl_and_tokens(client, url)
                start, scrapes = time.monotonic(), 0
                while time.monotonic() - start < args.phase_s:
                    if every:
                        client.get(url + "/metrics")
                        scrapes += 1
                    time.sleep(every or 0.1)
                s1, c1, g1 = itl_and_tokens(client, url)
                row = {"itl_ms": (s1 - s0) / (c1 - c0) * 1e3, "tokens_per_s": (g1 - g0) / (time.monotonic() - start),
                       "scrapes": scrapes}
                rows[mode].append(row)
                print(r, mode, f"ITL {row['itl_ms']:.2f} ms, {row['tokens_per_s']:.1f} tok/s, {scrapes} scrapes",
                      flush=True)
    finally:
        load.kill()
        server.terminate()
        server.wait()
    print("| /metrics scrapes | mean inter-token latency, ms (median of phases) | output tokens/s | phases |")
    print("|---|---|---|---|")
    for mode, rs in rows.items():
        print(f"| {mode} | {statistics.median(x['itl_ms'] for x in rs):.2f} | "
              f"{statistics.median(x['tokens_per_s'] for x in rs):.0f} | {len(rs)} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
