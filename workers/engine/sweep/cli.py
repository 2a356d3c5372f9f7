"""``sweep CONFIG.json``: a tuning sweep from the command line, for node operators.

    python -m workers.engine sweep config.json --batch-sizes 1,2,4 --page-sizes 16,32 --precisions fp32,bf16 --json

Lengths take a fixed ``32``, a uniform range ``16-64`` or a list ``16,32,48``. ``--hardware`` reads a JSON file with
``memory_bandwidth_bytes_per_s`` and ``flops_per_s`` by precision (the env check's figures); without it the sweep
measures the device itself the way the env check does, and the output's ``roofline.source`` says which. Without
``--json`` it prints the trials as ``manage.py sweep`` does (``format_summary``: the rows of ``trial_row``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .runner import run_sweep
from .result import SweepResult
from .search import SEARCH_HELP, SEARCHES
from .stage import MIN_REPEATS
from .trial_row import SWEEP_COLUMNS, figure, sweep_table


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None


def _repeats(text: str) -> int:
    value = int(text)
    if value < MIN_REPEATS:
        raise argparse.ArgumentTypeError(f"at least {MIN_REPEATS}: one run's figure can be several times another's")
    return value


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _length(text: str):
    """``32`` (fixed), ``16-64`` (uniform, both ends included) or ``16,32,48`` (used in turn)."""
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-", 1))
            return {"uniform": [low, high]}
        values = _ints(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a length such as 32, 16-64 or 16,32,48, not {text!r}") from None
    return values[0] if len(values) == 1 else values


def add_parser(verbs) -> argparse.ArgumentParser:
    parser = verbs.add_parser("sweep", help="tuning sweep: serve a model under a grid of settings, report metrics",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path, help="the model's config.json")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--batch-sizes", type=_ints, default=[1, 2, 4], help="concurrency / batch sizes")
    parser.add_argument("--page-sizes", type=_ints, default=[16], help="KV-cache page (block) sizes in tokens")
    parser.add_argument("--precisions", type=_names, default=["fp32"], help="fp32, bf16, fp16, int8 (dynamic)")
    parser.add_argument("--max-batch-tokens", type=_ints, default=[256], help="tokens per forward step at most")
    parser.add_argument("--prompt-len", type=_length, default=32, help="prompt tokens: 32, 16-64 or 16,32,48")
    parser.add_argument("--output-len", type=_length, default=16, help="output tokens: 16, 8-24 or 8,16")
    parser.add_argument("--requests", type=int, default=16, help="measured requests per trial")
    parser.add_argument("--arrival-rate", type=float, help="Poisson arrivals at this many requests/s "
                                                            "(default: a closed loop)")
    parser.add_argument("--concurrency", type=int, help="requests in flight (default: the trial's batch size)")
    parser.add_argument("--slo-ttft-ms", type=float, help="TTFT SLO for goodput, in ms")
    parser.add_argument("--slo-tpot-ms", type=float, help="TPOT SLO for goodput, in ms")
    parser.add_argument("--search", choices=tuple(SEARCHES), default="grid", help=SEARCH_HELP)
    parser.add_argument("--device", help="torch device (default: the first accelerator, else the CPU)")
    parser.add_argument("--hardware", type=Path, help="JSON file with the node's bandwidth and FLOP/s")
    parser.add_argument("--full-model", action="store_true", help="serve the full model, not the reduced one")
    parser.add_argument("--repeats", type=_repeats, default=3,
                        help="runs per configuration (at least 3); the median is reported with the spread")
    parser.add_argument("--confirm-top", type=int, default=3,
                        help="the best trials served again (at least 2) to pick the best by its re-measured "
                             "median: confirmed when its runs are all above the runner-up's, else a tie")
    return parser


def run(args: argparse.Namespace, progress=None) -> dict:
    config = json.loads(args.config.read_text())
    workload = {"requests": args.requests, "prompt_len": args.prompt_len, "output_len": args.output_len}
    if args.arrival_rate is not None:
        workload.update(arrival="poisson", rate=args.arrival_rate)
    if args.concurrency is not None:
        workload["concurrency"] = args.concurrency
    slo = {key: value / 1000 for key, value in (("ttft_s", args.slo_ttft_ms), ("tpot_s", args.slo_tpot_ms))
           if value is not None}
    if slo:
        workload["slo"] = slo
    grid = {"precision": args.precisions, "batch_size": args.batch_sizes, "page_size": args.page_sizes,
            "max_batch_tokens": args.max_batch_tokens}
    hardware = json.loads(args.hardware.read_text()) if args.hardware else None
    return run_sweep(config, grid=grid, workload=workload, search=args.search, device=args.device,
                     hardware=hardware, progress=progress, reduce=not args.full_model, repeats=args.repeats,
                     confirm_top=args.confirm_top)


def _count(number, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def format_summary(stored: dict) -> str:
    """The sweep for a terminal: the model served, the trials' table, the best configuration and the search."""
    result = SweepResult.from_dict(stored)
    model, backend = result.model, result.backend if isinstance(result.backend, dict) else {}
    shape = (f"reduced to {model.get('layers')} of {model.get('full_layers')} layers" if model.get("reduced")
             else f"full model, {model.get('layers')} layers")
    lines = ["", f"Model: {model.get('model_type')}, {shape}; served by {backend.get('name')} on "
                 f"{backend.get('device', '?')}", *sweep_table(result).terminal_lines()]
    best = result.best
    if best:
        params = best.params
        efficiency = best.efficiency.sentence if best.efficiency else "no roofline"
        lines.append(f"Best: trial {best.id}: {params.get('precision')}, batch size {params.get('batch_size')}, page "
                     f"size {params.get('page_size')}, max batch tokens {params.get('max_batch_tokens')}: "
                     f"{figure(SWEEP_COLUMNS, 'output_tokens_per_s', best)} output tokens/s, "
                     f"TTFT p50 {figure(SWEEP_COLUMNS, 'ttft_p50_s', best)}, "
                     f"TPOT p50 {figure(SWEEP_COLUMNS, 'tpot_p50_s', best)}, {efficiency}")
        if result.verdict:
            lines.append(f"Verdict: {result.verdict.verdict}: {result.verdict.reason}")
    else:
        lines.append("Best: none (no trial served the full workload)")
    search = result.search
    seconds = search.get("seconds")
    lines.append(f"Search: {search.get('strategy')}, {_count(search.get('trials_run'), 'trial')} run of "
                 f"{_count(search.get('configurations'), 'configuration')}, "
                 f"{_count(search.get('requests_served'), 'request')} served, "
                 f"{'-' if seconds is None else format(seconds, '.1f')} s")
    return "\n".join(lines)
