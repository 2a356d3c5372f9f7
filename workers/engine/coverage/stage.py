"""The ``op_coverage`` node stage: what it takes (``PARAMETERS``, read by the control plane and the web tier without
torch) and ``op_coverage``, which imports the tracing machinery (``report``, torch and transformers) when it runs.
"""

from __future__ import annotations

from collections.abc import Callable

from ..parameters import Parameter, device_string, validate
from ..stage_spec import StageSpec

Progress = Callable[[float, str], None]


def _operator_list(backend: dict) -> None:
    if set(backend) != {"name", "operators"} or not isinstance(backend["name"], str) or not isinstance(
            backend["operators"], list) or not all(isinstance(name, str) for name in backend["operators"]):
        raise ValueError("a virtual backend is {\"name\": str, \"operators\": [aten operator names]}")


PARAMETERS = (
    Parameter("config", "object", "the model's config.json (the job's model)", set_by="control"),
    Parameter("dtypes", "list", "dtypes of the traced model", default=["bf16"], max_items=3,
              item=Parameter("dtype", "choice", "a dtype", choices=("bf16", "fp16", "fp32"))),
    Parameter("virtual_backends", "list", "ids of the team's virtual backends (operator lists) to judge as well",
              default=[], max_items=32, item=Parameter("id", "int", "a virtual backend's id", minimum=1)),
    Parameter("virtual_backend_lists", "list", "the operator lists of those virtual backends", set_by="control",
              max_items=32, item=Parameter("backend", "object", "name and operators", check=_operator_list)),
    Parameter("decode_steps", "int", "decode steps traced after the prefill", default=3, minimum=0, maximum=64),
    Parameter("compile", "bool", "check torch.compile readiness", default=True),
    Parameter("compile_backend", "choice", "torch.compile backend (default: inductor, aot_eager on a CPU)",
              nullable=True, choices=("inductor", "aot_eager", "eager")),
    Parameter("device", "str", "device to check, e.g. cuda:1 (default: the node's accelerator, else cpu)",
              nullable=True, check=device_string),
)


def op_coverage(params: dict, progress: Progress) -> dict:
    """Stage ``op_coverage``: ``run_coverage`` once per dtype for the node's own backend, and once per dtype for
    each virtual backend described by an operator list (``PARAMETERS`` says what it takes; the control plane turns
    the job's ``virtual_backends`` ids into ``virtual_backend_lists``). Returns ``{"model_type", "dtypes",
    "reports": {dtype: report}, "virtual": {name: {dtype: report}}, "coverage": the lowest coverage of the node's
    own reports}``.
    """
    from .report import run_coverage, torch_dtype

    params = validate("op_coverage", PARAMETERS, params, control=True)
    config = params.get("config")
    if not isinstance(config, dict):
        raise ValueError("op_coverage needs params['config'], a config.json object")
    dtypes = list(params.get("dtypes") or ["bf16"])
    for name in dtypes:
        torch_dtype(name)
    # The node's own backend first; a virtual backend is only ever an operator list sent by the control plane,
    # never a path read on the node.
    backends = [(None, None)] + [(virtual["name"], virtual) for virtual in params.get("virtual_backend_lists") or []]
    runs = [(backend, dtype) for backend in backends for dtype in dtypes]
    results: dict = {}
    for index, ((virtual_name, backend_list), name) in enumerate(runs):
        label = f"{virtual_name or 'node'} {name}"

        def scaled(fraction: float, message: str, index=index, label=label) -> None:
            progress((index + fraction) / len(runs), f"{label}: {message}")

        results.setdefault(virtual_name, {})[name] = run_coverage(
            config, dtype=name, device=params.get("device"), backend_list=backend_list, progress=scaled,
            decode_steps=int(params.get("decode_steps", 3)), check_compile=bool(params.get("compile", True)),
            compile_backend=params.get("compile_backend"))
    reports = results.pop(None)
    return {"model_type": config.get("model_type"), "dtypes": dtypes, "reports": reports, "virtual": results,
            "coverage": min(report["coverage"] for report in reports.values())}


STAGES = (
    StageSpec(kind="op_coverage", run=op_coverage, gated=True, needs_model=True, parameters=PARAMETERS,
              preload=("torch", "transformers", "workers.engine.models.reducer", "workers.engine.coverage.report")),
)
