"""Tuning sweeps and benchmark reports: serve a model under a grid of engine settings and report, per trial, the
serving metrics (TTFT, TPOT, ITL, E2E latency, throughput, goodput, peak memory; vLLM's definitions, see
``metrics``) and a roofline (predicted ceiling time, efficiency, memory- or compute-bound; see ``roofline``).

Every trial is served ``repeats`` (>= 3) times and reported as its median run with the spread; the best
configuration is judged by re-measuring the search's top candidates (``confirm``): confirmed only when all its runs
are above the runner-up's, else inconclusive at this noise (``verdict``, which the engine's serve sweep shares);
where the paged cache cannot serve the architecture, page size and max batch tokens are not swept. The roofline's
ceilings are the node's latest env check (the control plane passes them) or measured the env check's way, and its
per-step overhead is fitted over the sweep's smallest trials and reported (``roofline``).

``run_sweep(config, grid=..., workload=..., search="grid"|"smart")`` is the entry point; ``sweep_stage`` is the same
as a node stage. What it returns, and what a serving sweep returns, is typed in ``result`` (with the efficiency rule);
``trial_row`` declares a trial's columns once for the report pages, the CSV and the command lines.

Plain Python + torch + transformers: no Django, so it runs on bare GPU nodes. Importing the package imports neither
(the stage's ``PARAMETERS`` are checked by the control plane and the web tier): the backends, the roofline and torch
are imported when a sweep runs.

    grid = {"precision": ["fp32", "bf16"], "batch_size": [1, 2, 4], "page_size": [16, 32],
            "max_batch_tokens": [256]}
    workload = {"requests": 16, "prompt_len": 32, "output_len": {"uniform": [8, 24]}, "arrival": "closed",
                "slo": {"ttft_s": 0.5, "tpot_s": 0.05}}
"""

from .runner import REPEATS, repeated, resolve_device, run_sweep
from .stage import PARAMETERS, PROXY_BACKENDS, SweepFailed, check_hardware, sweep_stage

__all__ = ["PARAMETERS", "PROXY_BACKENDS", "REPEATS", "SweepFailed", "check_hardware", "repeated", "resolve_device",
           "run_sweep", "sweep_stage"]
