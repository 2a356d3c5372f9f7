"""Serving metrics from per-request timestamps, defined as vLLM's serving benchmark defines them.

Source: vLLM ``vllm/benchmarks/serve.py`` (``calculate_metrics``), so d0's figures compare with ``vllm bench serve``:

- TTFT (time to first token): first token time - request send time.
- E2E latency (vLLM "E2EL"): last token time - request send time ("from sending a request to receiving a complete
  response").
- TPOT (time per output token, excluding the first): (E2E latency - TTFT) / (output tokens - 1), per request, only
  for requests with more than one output token.
- ITL (inter-token latency): every gap between two consecutive tokens of a request, all requests pooled (for a
  streamed response: between consecutive chunks, as vLLM measures it).
- Benchmark duration: first send to last token of the measured requests (warm-up excluded).
- Output tokens/s = all output tokens / duration; requests/s = completed requests / duration; total tokens/s adds
  the prompt tokens.
- Goodput under SLOs: requests meeting every given SLO (TTFT, TPOT, E2E latency; a request with one output token
  counts TPOT as 0, as vLLM does) per second of duration (vLLM ``request_goodput``, ``--goodput ttft:MS tpot:MS``).
  SLOs on a percentile (``ttft_p95_ms``: the run's TTFT p95 at most that many ms) judge the run as a whole, as
  DistServe's and GuideLLM's goodput does: a run that breaks one counts no request as good.
- mean and the p50/p90/p99 percentiles, with linear interpolation between ranks (numpy's default, which vLLM uses).

All times are seconds, from one monotonic clock (``time.perf_counter``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

PERCENTILES = (50, 90, 99)

DEFINITIONS = {
    "source": "vLLM vllm/benchmarks/serve.py calculate_metrics",
    "ttft_s": "first token time - request send time",
    "tpot_s": "(e2e latency - ttft) / (output tokens - 1), per request with more than one output token",
    "itl_s": "every gap between consecutive tokens of a request, all requests pooled",
    "e2e_latency_s": "last token time - request send time",
    "duration_s": "first measured send to last measured token (warm-up excluded)",
    "output_tokens_per_s": "output tokens / duration",
    "requests_per_s": "completed requests / duration",
    "goodput_requests_per_s": "requests meeting every SLO (ttft, tpot, e2e latency) / duration; none when the run "
                              "breaks a percentile SLO (ttft_p95_ms...)",
    "percentiles": "linear interpolation between closest ranks (numpy default)",
}


@dataclass(frozen=True)
class RequestRecord:
    """What a backend observed of one request: when it was sent and when each output token arrived."""

    send_time: float
    token_times: list[float]
    prompt_tokens: int
    error: str | None = None
    # A server streams chunks, not tokens: ``token_times`` then holds when each chunk came and this the output
    # tokens the server counted (its usage), as vLLM's benchmark counts them.
    reported_output_tokens: int | None = None

    @property
    def output_tokens(self) -> int:
        return self.reported_output_tokens if self.reported_output_tokens is not None else len(self.token_times)

    @property
    def completed(self) -> bool:
        return self.error is None and bool(self.token_times)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.send_time

    @property
    def e2e_latency(self) -> float:
        return self.token_times[-1] - self.send_time

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e_latency - self.ttft) / (self.output_tokens - 1)

    @property
    def inter_token_latencies(self) -> list[float]:
        return [later - earlier for earlier, later in pairwise(self.token_times)]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks (numpy.percentile's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: list[float]) -> dict | None:
    if not values:
        return None
    summary = {"mean": sum(values) / len(values), "count": len(values)}
    summary.update({f"p{q}": percentile(values, q) for q in PERCENTILES})
    return summary


# Per-request SLOs, in seconds (vLLM's --goodput keys).
REQUEST_SLO_KEYS = ("ttft_s", "tpot_s", "e2e_latency_s")
# SLOs on a percentile of the run, in milliseconds: "<latency>_p<q>_ms".
PERCENTILE_SLO_LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")
SLO_PERCENTILES = (50, 90, 95, 99)
PERCENTILE_SLO_KEYS = tuple(f"{latency}_p{q}_ms" for latency in PERCENTILE_SLO_LATENCIES for q in SLO_PERCENTILES)


def meets_slo(record: RequestRecord, slo: dict) -> bool:
    observed = {"ttft_s": record.ttft, "tpot_s": record.tpot or 0.0, "e2e_latency_s": record.e2e_latency}
    return all(observed[key] <= limit for key, limit in slo.items() if key in REQUEST_SLO_KEYS)


def latencies(completed: list[RequestRecord]) -> dict[str, list[float]]:
    """Each latency's values over the completed requests, in seconds, named as the percentile SLOs name them."""
    return {"ttft": [record.ttft for record in completed],
            "tpot": [record.tpot for record in completed if record.tpot is not None],
            "itl": [gap for record in completed for gap in record.inter_token_latencies],
            "e2e_latency": [record.e2e_latency for record in completed]}


def percentile_ms(values: list[float], key: str) -> float | None:
    """``key``'s percentile (``ttft_p95_ms`` -> the 95th) of ``values`` (seconds), in milliseconds."""
    q = int(key.rsplit("_p", 1)[1].removesuffix("_ms"))
    return percentile(values, q) * 1e3 if values else None


def percentile_slo_breaches(values: dict[str, list[float]], slo: dict) -> list[str]:
    """The percentile SLOs a run breaks, given its ``latencies`` (a latency with no values, e.g. TPOT of one-token
    outputs, breaks none)."""
    breaches = []
    for key, limit in slo.items():
        if key in PERCENTILE_SLO_KEYS:
            observed = percentile_ms(values[key.rsplit("_p", 1)[0]], key)
            if observed is not None and observed > limit:
                breaches.append(key)
    return breaches


# Raw end-to-end latencies kept per trial for the latency CDF; more requests than this are thinned evenly.
MAX_SAMPLES = 2000


def samples(values: list[float]) -> list[float]:
    """The values sorted, at most MAX_SAMPLES of them (evenly spaced ranks, the first and last kept)."""
    ordered = sorted(values)
    if len(ordered) <= MAX_SAMPLES:
        return ordered
    step = (len(ordered) - 1) / (MAX_SAMPLES - 1)
    return [ordered[round(index * step)] for index in range(MAX_SAMPLES)]


def summarize(records: list[RequestRecord], slo: dict | None = None) -> dict:
    """The trial's serving metrics (see the module docstring for each definition)."""
    completed = [record for record in records if record.completed]
    if not completed:
        return {"completed": 0, "failed": len(records)}
    duration = max(record.token_times[-1] for record in completed) - min(record.send_time for record in records)
    output_tokens = sum(record.output_tokens for record in completed)
    prompt_tokens = sum(record.prompt_tokens for record in completed)
    values = latencies(completed)
    metrics = {
        "completed": len(completed),
        "failed": len(records) - len(completed),
        "duration_s": duration,
        "total_input_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / duration,
        "requests_per_s": len(completed) / duration,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / duration,
        **{f"{name}_s": distribution(found) for name, found in values.items()},
        # Every completed request's end-to-end latency, sorted: the CDF is drawn from these, not from percentiles.
        "e2e_latency_samples_s": samples(values["e2e_latency"]),
        "slo": dict(slo) if slo else None,
        "good_requests": None,
        "goodput_requests_per_s": None,
    }
    if slo:
        breaches = percentile_slo_breaches(values, slo)
        good = 0 if breaches else sum(meets_slo(record, slo) for record in completed)
        metrics["good_requests"] = good
        metrics["goodput_requests_per_s"] = good / duration
        if any(key in PERCENTILE_SLO_KEYS for key in slo):
            metrics["slo_breaches"] = breaches
    return metrics
