"""Operator coverage as the pages and the API see it: storing a stage's reports and growing the operator
library, the operator lists of a team's virtual backends, a model's gap table with suggested fixes, and the diff
of two models."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from ..models import CoverageReport, ModelSpec, OperatorRecord, StageRun, VirtualBackend

FIXES = {
    "native": "none: the backend has a kernel",
    "composite": "none: it runs through its composite kernel on operators the backend has",
    "decomposable": "register its decomposition for this backend, or let torch.compile lower it",
    "missing": "write a kernel (a torch.library custom op for this backend) or fall back to the CPU (slow)",
    "failed": "it raised during the trace: see the error; usually a kernel is missing for this dtype",
}


def suggested_fix(operator: dict) -> str:
    """The engine's own suggestion (it names the operators the backend has and lacks) where the report has one."""
    status = operator.get("status")
    if status == "failed" and operator.get("error"):
        return f"{FIXES['failed']} ({operator['error'][:160]})"
    if operator.get("suggestion") and status in ("decomposable", "missing"):
        return operator["suggestion"]
    if status == "decomposable" and operator.get("basic_operators"):
        basics = ", ".join(basic["name"] for basic in operator["basic_operators"][:6])
        return f"rebuild from basic operators ({basics}): {FIXES['decomposable']}"
    return FIXES.get(status, "")


@transaction.atomic
def store_op_coverage(run: StageRun) -> None:
    """One CoverageReport per backend × dtype of the stage's result, and the team's operator library updated;
    each report lists the operators its backend had never been checked on before."""
    result = run.result or {}
    job = run.job
    by_backend = [result.get("reports", {}), *result.get("virtual", {}).values()]
    now = timezone.now()
    for by_dtype in by_backend:
        for dtype, report in by_dtype.items():
            backend = backend_label(report)
            known = dict(OperatorRecord.objects.filter(team=job.team, backend=backend)
                         .values_list("operator", "pk"))
            operators = report.get("operators", [])
            new = [operator["name"] for operator in operators if operator["name"] not in known]
            CoverageReport.objects.create(model=job.model, job=job, stage_run=run, node=run.node, backend=backend,
                                          dtype=dtype, coverage=report.get("coverage", 0.0), new_operators=new,
                                          report=report)
            for operator in operators:
                if operator["name"] in known:
                    OperatorRecord.objects.filter(pk=known[operator["name"]]).update(status=operator["status"],
                                                                                     last_verified=now)
            OperatorRecord.objects.bulk_create([
                OperatorRecord(team=job.team, backend=backend, operator=operator["name"], status=operator["status"],
                               last_verified=now, first_model=job.model)
                for operator in operators if operator["name"] not in known
            ], ignore_conflicts=True)


def backend_label(report: dict) -> str:
    """cpu, cuda:NVIDIA H200, virtual:vendorx — the device name matters: an H100 and an MI300X differ."""
    backend = report.get("backend", {})
    name = backend.get("name", "unknown")
    device_name = backend.get("device_name")
    return f"{name}:{device_name}" if device_name and not backend.get("virtual") else name


def latest_reports(reports) -> dict[tuple[int, str, str], CoverageReport]:
    """The newest report per (model, backend, dtype)."""
    latest = {}
    for report in reports.order_by("-created"):
        latest.setdefault((report.model_id, report.backend, report.dtype), report)
    return latest


def gap_rows(report: CoverageReport) -> list[dict]:
    new = set(report.new_operators)
    return [{"name": operator["name"], "count": operator.get("count", 0), "status": operator["status"],
             "fix": suggested_fix(operator), "new": operator["name"] in new}
            for operator in report.gaps]


def operators_needed(model: ModelSpec, backend: str | None) -> dict[str, dict]:
    """Operator name → (count, status) over the model's newest reports (on ``backend``, or on any)."""
    reports = CoverageReport.objects.filter(model=model)
    if backend:
        reports = reports.filter(backend=backend)
    needed: dict[str, dict] = {}
    for report in latest_reports(reports).values():
        for operator in report.report.get("operators", []):
            entry = needed.setdefault(operator["name"], {"count": 0, "status": operator["status"]})
            entry["count"] += operator.get("count", 0)
    return needed


def diff(model: ModelSpec, other: ModelSpec, backend: str | None) -> list[dict]:
    """What ``model`` needs that ``other`` did not: operators only it uses, with their status."""
    theirs = operators_needed(other, backend)
    return [{"name": name, **entry} for name, entry in sorted(operators_needed(model, backend).items())
            if name not in theirs]


def operator_lists(team, backend_ids) -> list[dict]:
    """The team's virtual backends among ``backend_ids`` as the node's stage takes them: name and operators."""
    backends = VirtualBackend.objects.filter(team=team, pk__in=backend_ids)
    return [{"name": backend.name, "operators": backend.operators} for backend in backends]


def shipped_backend_rows(virtual_backends) -> list[dict]:
    """The backends d0 ships, each with the teams (among ``virtual_backends``' teams) that have added it."""
    from workers.engine.coverage.shipped_backends import shipped_backends

    added: dict[str, list[str]] = {}
    for backend in virtual_backends:
        added.setdefault(backend.name, []).append(backend.team.name)
    return [{"name": backend["name"], "dispatch_key": backend["dispatch_key"], "torch": backend["torch"],
             "operators": len(backend["operators"]), "description": backend["description"],
             "teams": sorted(added.get(backend["name"], []))} for backend in shipped_backends()]


@transaction.atomic
def add_shipped_backends(team, user, names) -> list[VirtualBackend]:
    """The named shipped backends as the team's virtual backends (their lists refreshed if already there)."""
    from workers.engine.coverage.shipped_backends import shipped_backend

    added = []
    for name in names:
        backend = shipped_backend(name)
        if backend is None:
            raise ValueError(f"d0 ships no backend {name!r}")
        row, _ = VirtualBackend.objects.update_or_create(
            team=team, name=name, defaults={"operators": backend["operators"], "description": backend["description"]},
            create_defaults={"operators": backend["operators"], "description": backend["description"],
                             "created_by": user})
        added.append(row)
    return added
