"""Engine commands for node operators: ``python -m workers.engine <verb> [...] --json``."""

from __future__ import annotations

import argparse
import json
import sys

from .probe import env_probe


def _stderr_progress(fraction: float, message: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r[{int(fraction * 100):3d}%] {message:<40}")
        sys.stderr.flush()


def _print(result: dict, as_json: bool) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    if as_json:
        json.dump(result, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return
    for key, value in result.items():
        print(f"{key}: {json.dumps(value, indent=2, sort_keys=True)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.engine", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    probe = verbs.add_parser("probe", help="host facts and the devices torch can see")
    probe.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.verb == "probe":
        _print(env_probe({}, _stderr_progress), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
