"""Model intake as the pages, the API and the admin see it: reading an uploaded config.json (size limit, JSON, an
object at the top), adding a model from the catalog, and plans for serving a model on one of the team's clusters
(its registered devices and measured bandwidth) or on a what-if cluster described by hand ("8 × H200 per node").
The engine's analysis and planner (``workers/engine/analysis``) do the work; a model is analysed in
``ModelSpec.clean()`` on every upload, in the analysis process (``analysis``), and planned from that stored
analysis."""

from __future__ import annotations

import json

from django.conf import settings
from django.core.exceptions import ValidationError

from workers.engine.analysis import plan_from_analysis
from workers.engine.parameters import MAX_DEPTH, nesting_depth

from ..choices import NodeStatus
from ..models import Cluster, ModelPlan, ModelSpec
from . import catalog

# --- reading a config.json ------------------------------------------------------------------------------


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _non_finite_as_text(constant: str) -> str:
    """Released configs contain bare ``Infinity`` (Nemotron-H's time_step_limit), which Python's json reads but
    PostgreSQL's jsonb refuses; keep it as the text "Infinity" (or "-Infinity", "NaN") so nothing is lost."""
    return constant


def read_config_upload(upload) -> dict:
    """The parsed config from an uploaded file, or a ValidationError whose message a person can act on."""
    limit = settings.D0_MAX_CONFIG_BYTES
    if upload.size > limit:
        raise ValidationError(f"The file is {_mib(upload.size)}; the limit for a config.json is {_mib(limit)}.")
    raw = upload.read()
    try:
        config = json.loads(raw.decode("utf-8"), parse_constant=_non_finite_as_text)
    except UnicodeDecodeError:
        raise ValidationError("The file is not UTF-8 text; a config.json is JSON text.") from None
    except RecursionError:
        raise ValidationError(f"The JSON nests deeper than {MAX_DEPTH} levels; a config.json does not.") from None
    except json.JSONDecodeError as error:
        raise ValidationError(f"Not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}.") from None
    return check_config(config)


def check_config(config) -> dict:
    if not isinstance(config, dict):
        raise ValidationError(f"A config.json must be a JSON object ({{...}}), not {type(config).__name__}.")
    if nesting_depth(config) > MAX_DEPTH:
        raise ValidationError(f"The JSON nests deeper than {MAX_DEPTH} levels; a config.json does not.")
    size = len(json.dumps(config))
    if size > settings.D0_MAX_CONFIG_BYTES:
        raise ValidationError(f"The config is {_mib(size)}; the limit is {_mib(settings.D0_MAX_CONFIG_BYTES)}.")
    return config


def model_name(given: str, config: dict, filename: str = "") -> str:
    """The name given, else the config's ``_name_or_path``, else the uploaded file's name without .json."""
    candidates = [given, config.get("_name_or_path"), filename.rsplit("/", 1)[-1].removesuffix(".json")]
    for candidate in candidates:
        if isinstance(candidate, str) and candidate.strip() and candidate.strip() != "config":
            return candidate.strip()[:200]
    raise ValidationError("Give the model a name (the config has no _name_or_path).")


# --- the catalog ----------------------------------------------------------------------------------------


def add_from_catalog(*, team, user, slug: str) -> tuple[ModelSpec, bool]:
    """The team's model for a catalog entry, created if the team has none yet; (spec, created)."""
    entry = catalog.BY_SLUG[slug]
    existing = ModelSpec.objects.filter(team=team, catalog_slug=slug).first()
    if existing:
        return existing, False
    spec = ModelSpec(team=team, name=entry.name, config=entry.config(), catalog_slug=slug, created_by=user,
                     source_note=f"d0 catalog: {entry.hf_id}" + (f" ({entry.note})" if entry.note else ""))
    spec.full_clean()
    spec.save()
    return spec, True


# --- plans ----------------------------------------------------------------------------------------------

def starting_precision(spec: ModelSpec) -> tuple[str, str]:
    """The precision "Does it fit?" starts at, and how to say it: the release's own where the analysis knows how it
    ships (an FP8 release planned in bf16 would need twice the memory it does), else bf16."""
    shipped = ((spec.analysis or {}).get("weights_memory") or {}).get("as_shipped") or {}
    if shipped.get("format"):
        return "as_shipped", f"as shipped ({shipped['format']})"
    return "bf16", "bf16"


# "as_shipped": each tensor as the release stores it (its quantization_config: MXFP4 experts, FP8 blocks...).
PLAN_PRECISIONS = ("as_shipped", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4")


def cluster_devices(cluster: Cluster) -> dict | None:
    """The planner's view of a cluster: its online nodes' accelerators (or CPUs), with measured bandwidth."""
    nodes = [node for node in cluster.nodes.all() if node.status == NodeStatus.ONLINE]
    per_node = []
    for node in nodes:
        devices = list(node.devices.all())
        per_node.append([device for device in devices if device.kind != "cpu"] or devices)
    per_node = [devices for devices in per_node if devices]
    if not per_node:
        return None
    everything = [device for devices in per_node for device in devices]
    measured = [device.measured.get("copy_bandwidth_bytes_per_s") for device in everything]
    return {
        "devices_per_node": min(len(devices) for devices in per_node),
        "nodes": len(per_node),
        "device_memory_bytes": min(device.memory_bytes for device in everything),
        "device_name": everything[0].name,
        # The slowest device sets the pace of a synchronous layout; only figures every device has count.
        "memory_bandwidth_bytes_per_s": min(measured) if measured and all(measured) else None,
    }


def analysed(spec: ModelSpec) -> dict:
    """The model's stored analysis; made again (and stored) for a row from before analyses were stored, or from
    before they held what the planner needs."""
    stored = (spec.analysis or {}).get("planner") or {}
    if not set(PLAN_PRECISIONS) <= set(stored.get("bytes", {})):
        spec.analysis = None
        spec.full_clean()
        spec.save(update_fields=["analysis"])
    return spec.analysis


def plan(spec: ModelSpec, devices: dict, precision: str, workload: dict | None = None) -> dict:
    try:
        return plan_from_analysis(analysed(spec), devices, precision, workload)
    except ValueError as error:  # the planner's own bounds (device counts, memory, concurrency)
        raise ValidationError(str(error)) from None


def record(spec: ModelSpec, devices: dict, precision: str, workload: dict, user, cluster=None) -> ModelPlan:
    result = plan(spec, devices, precision, workload)
    return ModelPlan.objects.create(model=spec, cluster=cluster, created_by=user, result=result,
                                    request={"devices": devices, "precision": precision, "workload": workload})
