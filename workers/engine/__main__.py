"""Engine commands for node operators: ``python -m workers.engine <verb> [...] --json``.

The pages, the API and the tests use the same functions, so what an operator sees here is what d0 stores.
Each verb module offers ``add_parser(verbs)`` and ``run(args[, progress]) -> dict``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys

from .analysis import cli as analyze_verb
from .coverage import cli as coverage_verb
from .sharding import cli as shard_verb
from .sweep import cli as sweep_verb
from .envcheck import env_check
from .probe import env_probe
from .progress import StderrProgress


class probe_verb:  # noqa: N801 - a verb module's shape, without a module of its own
    @staticmethod
    def add_parser(verbs):
        parser = verbs.add_parser("probe", help="host facts and the devices torch can see (instant)")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    @staticmethod
    def run(args, progress) -> dict:
        return env_probe({}, progress)


class envcheck_verb:  # noqa: N801
    @staticmethod
    def add_parser(verbs):
        parser = verbs.add_parser("envcheck", help="the full environment check: devices, links, measurements, checks")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--expected-devices", type=int, help="devices this node should have (fails when fewer)")
        parser.add_argument("--measure-seconds", type=float, default=0.3, help="timed work per measurement")

    @staticmethod
    def run(args, progress) -> dict:
        return env_check({"expected_devices_per_node": args.expected_devices,
                          "measure_seconds": args.measure_seconds}, progress)


VERBS = {"probe": probe_verb, "envcheck": envcheck_verb, "analyze": analyze_verb, "coverage": coverage_verb,
         "shard": shard_verb, "sweep": sweep_verb}


def _print(result: dict, as_json: bool, verb) -> None:
    if as_json:
        json.dump(result, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif hasattr(verb, "format_summary"):
        print(verb.format_summary(result))
    else:
        for key, value in result.items():
            print(f"{key}: {json.dumps(value, indent=2, sort_keys=True)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.engine", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS.values():
        verb.add_parser(verbs)
    args = parser.parse_args(argv)
    verb = VERBS[args.verb]
    progress = StderrProgress()
    takes_progress = len(inspect.signature(verb.run).parameters) > 1
    try:
        result = verb.run(args, progress) if takes_progress else verb.run(args)
    except (ValueError, OSError) as error:  # bad input (ConfigError is a ValueError) or an unreadable file
        progress.done()
        print(f"error: {error}", file=sys.stderr)
        return 2
    progress.done()
    _print(result, args.json, verb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
