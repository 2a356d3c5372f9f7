"""``endpoint_bench``: d0's load client against an OpenAI-compatible endpoint that is already running (a deployment
someone else runs), at one or more concurrencies, with the serving metrics every other d0 benchmark reports.

The control plane fills in the endpoint (base URL, served model name and its API key, decrypted from the team's
stored endpoint) when it dispatches the stage; the key is sent as a bearer token and appears nowhere in the result
or the log. Prompts are token ids below the job's model's vocabulary size, so the endpoint must serve that model
(or one with at least its vocabulary). The stage fails when no concurrency served its whole workload.

The node decides what it may reach: before any request the endpoint's host is resolved and every address checked
against the operator's allow-list (``endpoint_guard``), and the client connects to those addresses only. The
control plane's check of a base URL (``check_base_url``, at save and dispatch) refuses only what no node should
ever reach (other schemes, credentials in the URL, the cloud metadata services); it cannot know a node's network.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from ..sweep.metrics import DEFINITIONS, summarize
from ..sweep.result import Metrics, ServingBest, ServingTrial, TrialWorkload
from ..sweep.workload import Workload
from .checkpoint import vocab_size
from .client import Endpoint, run_requests
from .endpoint_guard import EndpointPolicy, metadata_host

MAX_CONCURRENCIES = 16


def _port_valid(parts) -> bool:
    try:
        parts.port  # noqa: B018 - urlsplit checks the port when it is read
    except ValueError:
        return False
    return True


def check_base_url(url: str) -> None:
    parts = urlsplit(url)
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment
            or not _port_valid(parts) or any(character in url for character in "\\ \t\r\n")):
        raise ValueError(f"an http(s) base URL such as http://host:8000, not {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("a base URL without credentials (user@host): give the endpoint's API key instead")
    if metadata_host(parts.hostname):
        raise ValueError(f"{parts.hostname} is a cloud metadata service, not an endpoint")
    if parts.path.rstrip("/").endswith("/v1"):
        raise ValueError("the base URL without /v1 (d0 adds /v1/completions)")


class EndpointBenchFailed(RuntimeError):
    pass


def run_endpoint_bench(params: dict, progress, policy: EndpointPolicy | None = None) -> dict:
    """The benchmark with ``params`` as the stage checked them, every parameter given (``stage.py``), reaching only
    what ``policy`` allows (default: this node's, from its environment)."""
    for key in ("config", "base_url", "served_model"):
        if not params.get(key):
            raise ValueError(f"an endpoint benchmark needs {key} (the control plane fills it from the endpoint)")
    vocab = vocab_size(params["config"])
    addresses = (policy or EndpointPolicy.from_environment()).pin(params["base_url"])
    endpoint = Endpoint(params["base_url"], params["served_model"], api_key=params.get("api_key") or None,
                        ignore_eos=params["ignore_eos"], addresses=addresses)
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
