"""``endpoint_bench``: d0's load client against an OpenAI-compatible endpoint that is already running (a deployment
someone else runs), at one or more concurrencies, with the serving metrics every other d0 benchmark reports.

The control plane fills in the endpoint (base URL, served model name and its API key, decrypted from the team's
stored endpoint) when it dispatches the stage; the key is sent as a bearer token and appears nowhere in the result
or the log. Prompts are token ids below the job's model's vocabulary size, so the endpoint must serve that model
(or one with at least its vocabulary). The stage fails when no concurrency served its whole workload.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from ..sweep.metrics import DEFINITIONS, summarize
from ..sweep.result import Metrics, ServingBest, ServingTrial, TrialWorkload
from ..sweep.workload import Workload
from .checkpoint import vocab_size
from .client import Endpoint, run_requests

MAX_CONCURRENCIES = 16


def check_base_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"an http(s) base URL such as http://host:8000, not {url!r}")
    if parts.path.rstrip("/").endswith("/v1"):
        raise ValueError("the base URL without /v1 (d0 adds /v1/completions)")


class EndpointBenchFailed(RuntimeError):
    pass


def run_endpoint_bench(params: dict, progress) -> dict:
    """The benchmark with ``params`` as the stage checked them, every parameter given (``stage.py``)."""
    for key in ("config", "base_url", "served_model"):
        if not params.get(key):
            raise ValueError(f"an endpoint benchmark needs {key} (the control plane fills it from the endpoint)")
    vocab = vocab_size(params["config"])
    endpoint = Endpoint(params["base_url"], params["served_model"], api_key=params.get("api_key") or None,
                        ignore_eos=params["ignore_eos"])
    workload = Workload.from_dict(params["workload"])
    started = time.perf_counter()
    trials = []
    concurrencies = params["concurrency"]
    for index, concurrency in enumerate(concurrencies):
        trial_workload = Workload.from_dict({**workload.as_dict(), "concurrency": concurrency})
        progress(index / len(concurrencies), f"concurrency {concurrency}: {trial_workload.requests} requests")
        try:
            run = run_requests(endpoint, trial_workload.measured_requests(vocab),
                               warmup=trial_workload.warmup(vocab, concurrency), in_flight=concurrency,
                               timeout_s=trial_workload.timeout_s)
        except TimeoutError as error:
            trials.append(ServingTrial(id=index, client={"concurrency": concurrency}, status="failed",
                                       cause="timed out", reason=str(error),
                                       workload=TrialWorkload(requests=trial_workload.requests,
                                                              arrival=trial_workload.arrival)).as_dict())
            continue
        failed = [record.error for record in run.records if record.error]
        metrics = summarize(run.records, trial_workload.slo)
        status = "ok" if not failed else "failed"
        trials.append(ServingTrial(
            id=index, client={"concurrency": concurrency}, status=status,
            reason=None if not failed else f"{len(failed)} of {len(run.records)} requests failed: {failed[0]}",
            metrics=Metrics.from_dict(metrics), client_cpu_s_per_request=run.client_cpu_s_per_request,
            workload=TrialWorkload(requests=trial_workload.requests, arrival=trial_workload.arrival,
                                   concurrency=concurrency)).as_dict())
    served = [trial for trial in trials if trial["status"] == "ok"]
    if not served:
        raise EndpointBenchFailed(f"no concurrency of {len(trials)} served its workload at {endpoint.base_url}: "
                                  + "; ".join(sorted({trial["reason"][:300] for trial in trials})))
    key = "goodput_requests_per_s" if workload.slo else "output_tokens_per_s"
    best = max(served, key=lambda trial: (trial["metrics"][key] or 0, trial["metrics"]["output_tokens_per_s"]))
    progress(1.0, "done")
    return {"endpoint": {"base_url": endpoint.base_url, "served_model": endpoint.model,
                         "api_key": "set" if endpoint.api_key else "none"},
            "weights": {"kind": "endpoint", "description": "whatever the endpoint serves (d0 did not start it)"},
            "workload": workload.as_dict(), "trials": trials,
            "best": ServingBest(id=best["id"], client=best["client"],
                                metrics=Metrics.from_dict(best["metrics"])).as_dict(),
            "seconds": time.perf_counter() - started, "metric_definitions": DEFINITIONS}
