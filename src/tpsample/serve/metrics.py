"""`/metrics`: vLLM's Prometheus metrics (its names, a `model_name` label), from the engine's clock.

Contract
- One `CollectorRegistry` per app (not prometheus_client's global one), so several servers in
  one process keep apart; the text format is prometheus_client's own (`render`).
- What clients receive is what is counted: a choice's finish reason is the one its client got (a
  stop string is "stop", a client that went away "abort"), so `vllm:request_success` and /stats'
  `finished` are the same numbers; `vllm:prompt_tokens` and `vllm:generation_tokens` move by the
  usage the responses report (a request's prompt once, however many choices).
- Times come from the engine's stamps (`TokenUpdate.time_s`, time.monotonic() on rank 0: one
  clock with the server's on one host) and its phases (`RequestTimings`): time to first token
  and end-to-end from the server's arrival stamp; one inter-token latency per step that gave a
  choice tokens; queue and prefill as the engine measured them; decode from the first to the
  last token delivered.
- Gauges (running, waiting, KV cache usage) and the engine's own counters (preemptions,
  speculative drafts) are read from the engine when /metrics is scraped (`observe_report`).
- Recording runs on the server's event loop, a few additions per step of a request; the engine
  loop only stamps its steps.
"""
from __future__ import annotations

import time
from collections import Counter

import prometheus_client as prom

from tpsample.engine.request import FINISH_REASONS, RequestTimings

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
LABELS = ("model_name", "engine")


class ServeMetrics:
    def __init__(self, model_name: str):
        prom.disable_created_metrics()          # as vLLM: no `_created` series beside the counters
        self.registry = prom.CollectorRegistry()
        self.finished: Counter[str] = Counter()          # /stats: choices finished, by finish reason
        labels = {"model_name": model_name, "engine": "0"}

        def metric(kind, name: str, doc: str, **kw):
            return kind(name, doc, LABELS, registry=self.registry, **kw).labels(**labels)

        self.running = metric(prom.Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = metric(prom.Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = metric(prom.Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = metric(prom.Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = metric(prom.Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = metric(prom.Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.drafts = metric(prom.Counter, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.draft_tokens = metric(prom.Counter, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.accepted_tokens = metric(prom.Counter, "vllm:spec_decode_num_accepted_tokens",
                                      "Number of accepted tokens.")
        success = prom.Counter("vllm:request_success", "Count of successfully processed requests.",
                               (*LABELS, "finished_reason"), registry=self.registry)
        self.success = {reason: success.labels(**labels, finished_reason=reason) for reason in FINISH_REASONS}
        self.ttft = metric(prom.Histogram, "vllm:time_to_first_token_seconds",
                           "Histogram of time to first token in seconds.", buckets=TTFT_BUCKETS)
        self.itl = metric(prom.Histogram, "vllm:inter_token_latency_seconds",
                          "Histogram of inter-token latency in seconds.", buckets=ITL_BUCKETS)
        self.e2e = metric(prom.Histogram, "vllm:e2e_request_latency_seconds",
                          "Histogram of e2e request latency in seconds.", buckets=REQUEST_BUCKETS)
        self.queue = metric(prom.Histogram, "vllm:request_queue_time_seconds",
                            "Histogram of time spent in WAITING phase for request.", buckets=REQUEST_BUCKETS)
        self.prefill = metric(prom.Histogram, "vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.", buckets=REQUEST_BUCKETS)
        self.decode = metric(prom.Histogram, "vllm:request_decode_time_seconds",
                             "Histogram of time spent in DECODE phase for request.", buckets=REQUEST_BUCKETS)
        self.inference = metric(prom.Histogram, "vllm:request_inference_time_seconds",
                                "Histogram of time spent in RUNNING phase for request.", buckets=REQUEST_BUCKETS)

    def request(self, num_prompt_tokens: int, arrival_s: float) -> RequestClock:
        """A request the engine accepted (arrived at time.monotonic() `arrival_s`): its prompt counts
        now; the clock follows its choices."""
        self.prompt_tokens.inc(num_prompt_tokens)
        return RequestClock(self, arrival_s)

    def observe_report(self, stats, resources: dict) -> None:
        """The engine's `Reported`: gauges as they stand, counters by what happened since the last one."""
        self.running.set(resources.get("running", 0))
        self.waiting.set(resources.get("waiting", 0))
        blocks = resources.get("num_kv_blocks", 0)
        self.kv_usage.set((blocks - resources.get("free_kv_blocks", 0)) / blocks if blocks else 0.0)
        self.preemptions.inc(stats.num_preemptions)
        self.drafts.inc(stats.num_drafts)
        self.draft_tokens.inc(stats.num_draft_tokens)
        self.accepted_tokens.inc(stats.num_accepted_drafts)

    def render(self) -> bytes:
        return prom.generate_latest(self.registry)

    def _finish(self, reason: str, e2e_s: float, timings: RequestTimings | None, decode_s: float) -> None:
        self.finished[reason] += 1
        self.success[reason].inc()
        self.e2e.observe(max(0.0, e2e_s))
        if timings is not None:
            self.queue.observe(max(0.0, timings.queued_s))
            self.prefill.observe(max(0.0, timings.prefill_s))
            self.decode.observe(max(0.0, decode_s))
            self.inference.observe(max(0.0, timings.prefill_s + decode_s))


CONTENT_TYPE = prom.CONTENT_TYPE_LATEST


class RequestClock:
    """The times of one HTTP request's choices, from the server's arrival stamp and the engine's
    step stamps."""

    def __init__(self, metrics: ServeMetrics, arrival_s: float):
        self.metrics, self.arrival_s = metrics, arrival_s
        self._first: dict[int, float] = {}          # choice -> time of its first token
        self._last: dict[int, float] = {}           # choice -> time of its latest token
        self._timings: dict[int, RequestTimings] = {}

    def tokens(self, choice: int, num_tokens: int, update) -> None:
        """`num_tokens` tokens delivered to choice `choice` from the engine's `update`."""
        if update.timings is not None:
            self._timings.setdefault(choice, update.timings)
        if not num_tokens:
            return
        m = self.metrics
        m.generation_tokens.inc(num_tokens)
        if choice in self._last:
            m.itl.observe(max(0.0, update.time_s - self._last[choice]))
        else:
            self._first[choice] = update.time_s
            m.ttft.observe(max(0.0, update.time_s - self.arrival_s))
        self._last[choice] = update.time_s

    def finished(self, choice: int, reason: str, update=None) -> None:
        """Choice `choice` ended with `reason` (the client's), at `update` (None: now, unannounced)."""
        if update is not None and update.timings is not None:
            self._timings.setdefault(choice, update.timings)
        end = update.time_s if update is not None and update.time_s else time.monotonic()
        first = self._first.get(choice)
        decode = self._last[choice] - first if first is not None else 0.0
        self.metrics._finish(reason, end - self.arrival_s, self._timings.get(choice), decode)
