"""The node stages about the node itself: ``env_probe`` (host facts, devices and torch build, in well under a
second; the node worker registers with the same probe) and ``env_check`` (the full check: software, devices,
topology, measured bandwidth and FLOP/s, collectives, and the checks that judge them, ``report``). What they take is
declared here without importing what they run, so the web tier reads it without torch."""

from __future__ import annotations

from ..parameters import Parameter, validate
from ..stage_spec import StageSpec

MEASURE_SECONDS = 1.0  # 1.45x worst max/min over five checks, idle CPU node
# A node operator's default for jobs that name none (a job's measure_seconds wins): quick checks on test or busy
# nodes, where the figures matter less than the checks.
DEFAULT_SECONDS_VARIABLE = "D0_ENVCHECK_MEASURE_SECONDS"

PARAMETERS = (
    Parameter("expected_devices_per_node", "int", "devices the node should have (the cluster's setting)",
              nullable=True, minimum=0, maximum=4096, set_by="control"),
    Parameter("measure_seconds", "float", "timed work per measurement (split over its repetitions)",
              default=MEASURE_SECONDS, minimum=0.01, maximum=30),
    Parameter("cpu_ranks", "int", "gloo processes for the collectives on a CPU-only node", default=2, minimum=2,
              maximum=16),
    Parameter("required_packages", "list", "packages the node must have (default: torch, transformers)",
              max_items=64, item=Parameter("package", "str", "a distribution name", maximum=100)),
)


def env_probe(params: dict, progress) -> dict:
    """The ``env_probe`` stage: host facts, devices and torch build."""
    from .probe import probe_devices, probe_host, torch_versions

    progress(0.1, "probing host")
    host = probe_host()
    progress(0.5, "probing devices")
    devices = probe_devices(host)
    progress(0.9, "reading torch build")
    return {"host": host, "devices": devices, "software": torch_versions()}


def env_check(params: dict, progress) -> dict:
    """The ``env_check`` stage: ``report.check_environment`` with the parameters checked."""
    from .report import check_environment

    return check_environment(validate("env_check", PARAMETERS, params, control=True), progress)


STAGES = (
    StageSpec(kind="env_probe", run=env_probe, gated=False, instant=True,
              preload=("torch", "workers.engine.envcheck.probe")),
    StageSpec(kind="env_check", run=env_check, gated=False, parameters=PARAMETERS,
              preload=("torch", "workers.engine.envcheck.report", "workers.engine.envcheck.measure")),
)
