"""Goodput: the highest load one running engine configuration sustains while meeting the workload's SLOs.

The load is a Poisson request rate (open loop, ``goodput_search: "rate"``) or a closed loop's concurrency
(``"concurrency"``). Goodput is DistServe's (Zhong et al. 2024): the highest request rate at which the SLOs are
attained; a concurrency search reports the requests/s measured at the highest concurrency that met them. A run at
one load meets the SLOs when no request failed, none of the run's percentile SLOs (``ttft_p95_ms``...) is broken and
at least ``ATTAINMENT`` of its requests meet the per-request ones (``ttft_s``...).

The search brackets, then bisects: from the workload's load it doubles after a run that met the SLOs (halves after
one that did not) until one run on each side is found, then tries the geometric middle (the integer middle for
concurrency) until the bracket is within ``TOLERANCE`` or the runs are spent. The next load depends on the
measurements only, so the same measurements give the same runs. Every run's percentiles are kept, ordered by load:
the rate sweep chart (latency percentiles against load, as GuideLLM draws it). Latency rises with load but a
measurement is noisy: a run that met the SLOs above the lowest that did not is kept in the chart, not trusted as
the answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..sweep.metrics import PERCENTILE_SLO_LATENCIES, latencies, percentile_ms, summarize
from ..sweep.workload import MAX_IN_FLIGHT, MAX_RATE, Workload
from .client import Endpoint, run_requests
from .launchers import ranks_of

# DistServe's goodput counts a load as served when 90% of its requests meet their SLOs.
ATTAINMENT = 0.90
# The bisection stops once the highest load that met the SLOs is within this share of the lowest that did not.
TOLERANCE = 0.05
GROWTH = 2.0
# The percentiles each rate sweep point keeps of every latency, in ms (a percentile SLO names one of them).
CHART_PERCENTILES = (50, 95, 99)


def devices(settings: dict) -> int:
    """The devices an engine configuration occupies: its ranks, TP x PP x DP."""
    replica, dp = ranks_of(settings)
    return replica * dp


def meets(metrics: dict, requests: int) -> bool:
    """Whether a run at one load met the SLOs (``summarize``'s metrics, SLOs given)."""
    completed = metrics.get("completed") or 0
    if completed < requests or metrics.get("slo_breaches"):
        return False
    good = metrics.get("good_requests")
    return good is None or good >= ATTAINMENT * completed


def sweep_point(load: float, over: str, metrics: dict, records, requests: int, seconds: float) -> dict:
    """One run of the search as the rate sweep chart and the JSON show it."""
    values = latencies([record for record in records if record.completed])
    point = {over: load, "met": meets(metrics, requests), "requests": requests,
             "completed": metrics.get("completed", 0), "failed": metrics.get("failed", 0),
             "slo_breaches": metrics.get("slo_breaches", []), "requests_per_s": metrics.get("requests_per_s"),
             "output_tokens_per_s": metrics.get("output_tokens_per_s"),
             "goodput_requests_per_s": metrics.get("goodput_requests_per_s"), "seconds": seconds}
    for latency in PERCENTILE_SLO_LATENCIES:
        for q in CHART_PERCENTILES:
            key = f"{latency}_p{q}_ms"
            point[key] = percentile_ms(values[latency], key)
    return point


@dataclass
class Probe:
    load: float
    met: bool
    metrics: dict
    point: dict


@dataclass
class GoodputSearch:
    """The runs of one configuration's search, in the order run, and what they found."""

    over: str
    probes: list[Probe] = field(default_factory=list)

    @property
    def best(self) -> Probe | None:
        """The run at the highest load that met the SLOs below the lowest load that did not."""
        failed = [probe.load for probe in self.probes if not probe.met]
        ceiling = min(failed, default=math.inf)
        return max((probe for probe in self.probes if probe.met and probe.load < ceiling),
                   key=lambda probe: probe.load, default=None)

    @property
    def rate_sweep(self) -> list[dict]:
        return [probe.point for probe in sorted(self.probes, key=lambda probe: probe.load)]

    def shown(self) -> Probe:
        """The run that stands for the configuration: the best, else (no load met the SLOs) the lowest load's."""
        return self.best or min(self.probes, key=lambda probe: probe.load)

    def summary(self, device_count: int) -> dict:
        """A trial's ``goodput`` (``result.Goodput``): the highest load that met the SLOs, the goodput (0 when no
        load did), that per device, the requests/s measured at that load, the runs and the rate sweep."""
        best = self.best
        measured = best.metrics["requests_per_s"] if best else None
        # A rate search's goodput is the rate itself (DistServe's): the requests/s measured over a short Poisson run
        # vary with its draw of gaps and with the drain of its last requests, which no configuration controls.
        goodput = (best.load if self.over == "rate" else measured) if best else 0.0
        return {"over": self.over, "max_load_meeting_slo": best.load if best else None,
                "goodput_requests_per_s": goodput, "measured_requests_per_s": measured, "devices": device_count,
                "goodput_per_device": goodput / device_count, "runs": len(self.probes),
                "serving_s": sum(probe.point["seconds"] for probe in self.probes), "rate_sweep": self.rate_sweep}


def next_load(search: GoodputSearch, *, lowest: float, highest: float, integer: bool,
              tolerance: float = TOLERANCE, growth: float = GROWTH) -> float | None:
    """The next load to run, or None when the bracket is narrow enough or the bounds are reached."""
    met = [probe.load for probe in search.probes if probe.met]
    failed = [probe.load for probe in search.probes if not probe.met]
    last = search.probes[-1].load
    if not failed:
        load = min(highest, math.ceil(last * growth) if integer else last * growth)
        return None if load <= max(met) else load
    ceiling = min(failed)
    floor = max((load for load in met if load < ceiling), default=None)
    if floor is None:
        load = max(lowest, math.floor(min(last, ceiling) / growth) if integer else min(last, ceiling) / growth)
        return None if load >= ceiling else load
    if integer:
        return None if ceiling - floor <= 1 else (floor + ceiling) // 2
    return None if ceiling <= floor * (1 + tolerance) else math.sqrt(floor * ceiling)


def find_goodput(measure: Callable[[float], Probe], start: float, over: str, max_runs: int, *,
                 tolerance: float = TOLERANCE) -> GoodputSearch:
    """The search over loads, each measured by ``measure(load)`` (a run at that load), at most ``max_runs``."""
    integer = over == "concurrency"
    lowest, highest = (1, MAX_IN_FLIGHT) if integer else (MAX_RATE / 1e9, MAX_RATE)
    search = GoodputSearch(over)
    load = start
    while load is not None and len(search.probes) < max_runs:
        search.probes.append(measure(load))
        load = next_load(search, lowest=lowest, highest=highest, integer=integer, tolerance=tolerance)
    return search


def serve_goodput(endpoint: Endpoint, workload: Workload, vocab: int, batch: int, progress=lambda message: None,
                  *, tolerance: float = TOLERANCE) -> tuple[GoodputSearch, list]:
    """The goodput search against a running endpoint; every run sends the workload's requests at its load (the
    same requests, Poisson arrivals rescaled to the rate), the first run after the workload's warm-up. Also every
    run's ``ClientRun``, in the order run."""
    over = workload.goodput_search
    runs = []

    def measure(load: float) -> Probe:
        at_load = Workload.from_dict({**workload.as_dict(), over: load})
        progress(f"goodput search run {len(runs) + 1}: {over} {load:.4g}, {at_load.requests} requests")
        started = time.perf_counter()
        try:
            run = run_requests(endpoint, at_load.measured_requests(vocab),
                               warmup=at_load.warmup(vocab, batch) if not runs else (),
                               in_flight=at_load.in_flight_limit(batch), timeout_s=at_load.timeout_s)
        except TimeoutError as error:
            # A load the engine cannot drain within the trial's timeout does not meet the SLOs; the search goes on.
            runs.append(None)
            metrics = {"completed": 0, "failed": at_load.requests, "timed_out": str(error)}
            point = sweep_point(load, over, metrics, [], at_load.requests, time.perf_counter() - started)
            return Probe(load, False, metrics, {**point, "timed_out": True})
        runs.append(run)
        metrics = summarize(run.records, at_load.slo)
        point = sweep_point(load, over, metrics, run.records, at_load.requests, time.perf_counter() - started)
        return Probe(load, point["met"], metrics, point)

    start = workload.rate if over == "rate" else (workload.concurrency or batch)
    return find_goodput(measure, start, over, workload.goodput_runs, tolerance=tolerance), runs


def goodput_trial(endpoint: Endpoint, workload: Workload, vocab: int, batch: int, settings: dict,
                  progress=lambda message: None) -> dict:
    """A serving trial's figures from a goodput search: its ``metrics`` (those of the run that stands for it, with
    the search's goodput), ``goodput`` (``GoodputSearch.summary``), the client's CPU seconds per
    request over every run, the requests in flight of the run shown and its failed requests' errors."""
    search, runs = serve_goodput(endpoint, workload, vocab, batch, progress)
    shown = search.shown()
    # The trial's goodput is the search's: a run's own (vLLM's good requests / duration) stands for one load only.
    goodput = search.summary(devices(settings))
    metrics = {**shown.metrics, "goodput_requests_per_s": goodput["goodput_requests_per_s"]}
    at_load = Workload.from_dict({**workload.as_dict(), search.over: shown.load})
    answered = [run for run in runs if run is not None]
    shown_run = runs[search.probes.index(shown)]
    return {"metrics": metrics, "goodput": goodput,
            "client_cpu_s_per_request": (sum(run.client_cpu_s_per_request for run in answered) / len(answered)
                                         if answered else None),
            "in_flight": at_load.in_flight_limit(batch), "requests": shown.point["requests"],
            # Any run's failed or unanswered request (an overloaded run's too): a deployment then waits for what its
            # other nodes report before judging the engine (``server.settle``).
            "any_failed": len(answered) < len(runs) or any(record.error for run in answered for record in run.records),
            "failed": ([record.error for record in shown_run.records if record.error] if shown_run
                       else [metrics["timed_out"]] * shown.point["requests"])}
