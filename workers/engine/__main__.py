"""Engine commands for node operators: ``python -m workers.engine <verb> [...] --json``.

The pages, the API and the tests use the same functions, so what an operator sees here is what d0 stores.
"""

from __future__ import annotations

import argparse
import json
import sys

from .envcheck import env_check
from .probe import env_probe


class StderrProgress:
    """A one-line progress bar on stderr, drawn only when a person is watching (stderr is a terminal)."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.active = stream.isatty()

    def __call__(self, fraction: float, message: str) -> None:
        if self.active:
            filled = int(fraction * 30)
            self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {int(fraction * 100):3d}% {message:<40}")
            self.stream.flush()

    def done(self) -> None:
        if self.active:
            self.stream.write("\n")


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        json.dump(result, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return
    for key, value in result.items():
        print(f"{key}: {json.dumps(value, indent=2, sort_keys=True)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.engine", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    probe = verbs.add_parser("probe", help="host facts and the devices torch can see (instant)")
    probe.add_argument("--json", action="store_true", help="print the report as JSON")
    envcheck = verbs.add_parser("envcheck", help="the full environment check: devices, links, measurements, checks")
    envcheck.add_argument("--json", action="store_true", help="print the report as JSON")
    envcheck.add_argument("--expected-devices", type=int, help="devices this node should have (fails when fewer)")
    envcheck.add_argument("--measure-seconds", type=float, default=0.3, help="timed work per measurement")
    args = parser.parse_args(argv)

    progress = StderrProgress()
    if args.verb == "probe":
        result = env_probe({}, progress)
    else:
        result = env_check({"expected_devices_per_node": args.expected_devices,
                            "measure_seconds": args.measure_seconds}, progress)
    progress.done()
    _print(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
