"""``bench-endpoint CONFIG.json``: d0's load client against an OpenAI-compatible endpoint already running.

    D0_ENDPOINT_API_KEY=... python -m workers.engine bench-endpoint config.json \\
        --base-url http://gpu-node-3:8000 --model deepseek-v3 --concurrency 1 4 16 --json

The key is read from the environment variable ``--api-key-env`` names (default D0_ENDPOINT_API_KEY), never from
the command line, where other users of the machine could read it. Prompts are token ids from the config's
vocabulary. The endpoint's addresses are checked as a node checks them: loopback, link-local and the other special
addresses only when ``--allow`` lists them (``--allow localhost`` for a server on this machine).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from .endpoint_guard import ALLOW_ENV, AllowList, EndpointPolicy

from ..sweep.result import EndpointBenchResult
from ..sweep.trial_row import endpoint_bench_table
from .cli import _object
from .stage import endpoint_bench


def _allow_list(text: str) -> AllowList:
    try:
        return AllowList.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(verbs) -> argparse.ArgumentParser:
    parser = verbs.add_parser("bench-endpoint", help="benchmark an OpenAI-compatible endpoint already running",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path, help="the served model's config.json (for its vocabulary)")
    parser.add_argument("--base-url", required=True, help="the server's base URL, without /v1")
    parser.add_argument("--model", required=True, help="the model name the endpoint serves")
    parser.add_argument("--api-key-env", default="D0_ENDPOINT_API_KEY",
                        help="environment variable holding the API key (default D0_ENDPOINT_API_KEY)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], help="one trial per value")
    parser.add_argument("--workload", type=_object, default={}, help="the workload (JSON, as the sweep's)")
    parser.add_argument("--no-ignore-eos", action="store_true", help="for servers that refuse ignore_eos")
    parser.add_argument("--allow", type=_allow_list, default=os.environ.get(ALLOW_ENV, ""), metavar="HOSTS",
                        help="hosts or CIDRs (comma-separated) the benchmark may reach although they are loopback, "
                             f"link-local or otherwise refused (default: ${ALLOW_ENV})")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def run(args: argparse.Namespace, progress=None) -> dict:
    params = {"config": json.loads(args.config.read_text()), "base_url": args.base_url,
              "served_model": args.model, "api_key": os.environ.get(args.api_key_env) or None,
              "concurrency": args.concurrency, "workload": args.workload, "ignore_eos": not args.no_ignore_eos}
    return endpoint_bench(params, progress or (lambda fraction, message: None),
                          EndpointPolicy(args.allow))


def format_summary(stored: dict) -> str:
    result = EndpointBenchResult.from_dict(stored)
    return "\n".join([f"{result.endpoint.get('served_model')} at {result.endpoint.get('base_url')}: "
                      f"{len(result.trials)} trials, {result.seconds or 0:.0f} s",
                      *endpoint_bench_table(result).terminal_lines()])
