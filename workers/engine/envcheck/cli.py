"""The ``probe`` and ``envcheck`` verbs of ``python -m workers.engine``:

    probe [--json]                                          host facts and the devices torch can see (instant)
    envcheck [--json] [--expected-devices 8] [--measure-seconds 1.0]     the full check (a few seconds)

``VERBS`` maps each verb to an object with ``add_parser(verbs)`` and ``run(args, progress) -> dict``, the shape
of every capability's ``cli`` module.
"""

from __future__ import annotations

from .stage import MEASURE_SECONDS, env_check, env_probe


class probe:  # noqa: N801 - a verb, named as it is typed
    @staticmethod
    def add_parser(verbs):
        parser = verbs.add_parser("probe", help="host facts and the devices torch can see (instant)")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    @staticmethod
    def run(args, progress) -> dict:
        return env_probe({}, progress)


class envcheck:  # noqa: N801
    @staticmethod
    def add_parser(verbs):
        parser = verbs.add_parser("envcheck", help="the full environment check: devices, links, measurements, checks")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--expected-devices", type=int, help="devices this node should have (fails when fewer)")
        parser.add_argument("--measure-seconds", type=float, default=MEASURE_SECONDS,
                            help="timed work per measurement, split over its repetitions")

    @staticmethod
    def run(args, progress) -> dict:
        return env_check({"expected_devices_per_node": args.expected_devices,
                          "measure_seconds": args.measure_seconds}, progress)


VERBS = {"probe": probe, "envcheck": envcheck}
