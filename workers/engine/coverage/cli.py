"""The ``coverage`` verb: ``python -m workers.engine coverage CONFIG.json [--json] [--dtype bf16]
[--backend-list FILE] [--decode-steps N] [--no-compile]``.

``add_parser`` and ``run`` are what ``workers/engine/__main__.py`` wires in; ``main`` runs the verb on its own
(``python -m workers.engine.coverage.cli coverage CONFIG.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .shipped_backends import shipped_backends


def shipped_names() -> list[str]:
    return [backend["name"] for backend in shipped_backends()]


def add_parser(verbs) -> argparse.ArgumentParser:
    parser = verbs.add_parser("coverage", help="which operators a model needs that this node's backend lacks")
    parser.add_argument("config", metavar="CONFIG.json", help="the model's config.json")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--dtype", default="bf16", help="dtype of the traced model: bf16 (default), fp16, fp32")
    parser.add_argument("--backend-list", metavar="FILE|NAME",
                        help="judge a virtual backend by its operator list (CSV or JSON), not this device's kernels; "
                             f"or one d0 ships: {', '.join(shipped_names()) or 'none'}")
    parser.add_argument("--decode-steps", type=int, default=3, help="decode steps after the prefill (default 3)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile check")
    parser.add_argument("--compile-backend", help="torch.compile backend (default: inductor, aot_eager on a CPU)")
    parser.add_argument("--device", help="device to check, e.g. cuda:1 (default: this node's accelerator, else cpu)")
    return parser


def run(args, progress=None) -> dict:
    from .report import run_coverage

    try:
        config = json.loads(Path(args.config).read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"cannot read {args.config}: {error}") from None
    return run_coverage(config, dtype=args.dtype, device=args.device, backend_list=args.backend_list,
                        progress=progress, decode_steps=args.decode_steps, check_compile=not args.no_compile,
                        compile_backend=args.compile_backend)


def format_summary(report: dict) -> str:
    """A few lines for a person: coverage, the gaps with their status, and what failed."""
    lines = [f"{report['architecture']} on {report['backend']['name']} ({report['dtype']}): "
             f"coverage {report['coverage']:.1%} of {len(report['operators'])} operators",
             "statuses: " + ", ".join(f"{status} {count}" for status, count in report["summary"]["statuses"].items())]
    by_name = {entry["name"]: entry for entry in report["operators"]}
    for name in report["gaps"]:
        entry = by_name[name]
        basic = ", ".join(item["name"] for item in entry["basic_operators"] or [])
        traced = f" (traced as {entry['traced_as']})" if entry.get("traced_as") else ""
        lines.append(f"  {entry['status']:<12} {name}{traced}" + (f" -> {basic}" if basic else ""))
        if entry.get("suggestion"):
            lines.append(f"               fix: {entry['suggestion']}")
    if report["trace"]["error"]:
        lines.append(f"trace stopped: {report['trace']['error']}")
    if report["compile"].get("checked"):
        compiled = report["compile"]
        lines.append(f"torch.compile ({compiled['backend']}): " +
                     ("ok" if compiled.get("compiles") else f"failed: {compiled.get('error')}"))
    return "\n".join(lines)
