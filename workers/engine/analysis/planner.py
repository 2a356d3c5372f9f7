"""Parallel layouts for serving a model on a cluster: which tensor x pipeline x data (x expert) splits fit in
device memory with headroom, the fewest devices that do, and a decode-throughput ranking from a memory-bandwidth
roofline.

Layout model (as vLLM and SGLang deploy MoE models):
- TP shards attention, dense and shared-expert weights and the vocabulary inside a node; norms and routers are
  replicated;
- PP splits the layers into equal stages (pp must divide the layer count), one stage after another;
- DP runs replicas, each serving concurrency / dp sequences; with EP, the replicas' attention is data-parallel
  ("DP attention") and the routed experts are spread over all tp x dp devices of a stage (ep = tp x dp, each
  device holding experts / ep whole experts); without EP the experts are TP-sharded like the dense weights.

Roofline (Williams et al. 2009; decode is memory-bound): a decode step reads every device's weights that the batch
touches and its sequences' KV cache once. Stages run one after another for a token, so
step time = sum over stages of (bytes one device of the stage reads) / memory bandwidth, and
decode tokens/s = concurrency / step time. Compute, communication and scheduling are ignored, so the figure is an
upper bound used for ranking, not a forecast.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from itertools import accumulate

from ..envcheck.peaks import published_peak, peaks_by_memory
from .config_loading import ConfigView
from .kv_cache import KvCache, KvLayer, kv_bytes_per_element
from .layers import Layout
from .memory import PRECISIONS, precision_named, tensor_bytes
from .parameters import TensorRecord

GIB = 2**30
# vLLM's default gpu_memory_utilization: 10% of each device stays free as headroom.
USABLE_FRACTION = 0.90
# CUDA context, NCCL buffers and CUDA graphs per device, as vLLM's startup logs typically show (1-3 GiB).
RUNTIME_OVERHEAD_BYTES = 2 * GIB
# Tokens of one chunked-prefill step (vLLM's max_num_batched_tokens scale on large GPUs).
PREFILL_CHUNK_TOKENS = 8192
DEFAULT_CONCURRENCY = 32
DEFAULT_CONTEXT_TOKENS = 8192
# Bounds that keep the layout enumeration to a fraction of a second (an NVL72 rack is one 72-device "node").
MAX_DEVICES_PER_NODE = 256
MAX_DEVICES = 4096
MAX_CONCURRENCY = 65536
# Cap on how far the planner looks for a cluster that fits, when the given one does not.
MAX_NODES_SEARCHED = 64
LAYOUTS_LISTED = 20

# When nothing matches: the slowest HBM part listed (A100 80GB), so a ranking never flatters an unknown device.
DEFAULT_BANDWIDTH = 2.039e12


@dataclass(frozen=True)
class Cluster:
    devices_per_node: int
    nodes: int
    device_memory_bytes: int
    memory_bandwidth_bytes_per_s: float | None = None
    device_name: str | None = None

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes


@dataclass(frozen=True)
class Workload:
    concurrency: int = DEFAULT_CONCURRENCY
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    kv_precision: str = "bf16"

    def __post_init__(self):
        if not (isinstance(self.concurrency, int) and 0 < self.concurrency <= MAX_CONCURRENCY):
            raise ValueError(f"concurrency must be 1..{MAX_CONCURRENCY}, got {self.concurrency!r}")
        if not (isinstance(self.context_tokens, int) and 0 < self.context_tokens <= 2**32):
            raise ValueError(f"context_tokens must be a positive token count, got {self.context_tokens!r}")
        kv_bytes_per_element(self.kv_precision)


def cluster_from(devices) -> Cluster:
    """A Cluster from a probe-style device list (one node; CPUs left out when accelerators exist) or a dict."""
    if isinstance(devices, Cluster):
        return devices
    if isinstance(devices, list) and devices and all(isinstance(device, dict) for device in devices):
        accelerators = [device for device in devices if device.get("kind") != "cpu"] or devices
        memory = min(int(device.get("memory_bytes") or 0) for device in accelerators)
        return _checked(Cluster(len(accelerators), 1, memory, None, accelerators[0].get("name")))
    if isinstance(devices, dict):
        try:
            return _checked(Cluster(
                int(devices.get("devices_per_node", devices.get("devices", 0))), int(devices.get("nodes", 1)),
                int(devices.get("device_memory_bytes", 0)), devices.get("memory_bandwidth_bytes_per_s"),
                devices.get("device_name")))
        except (TypeError, ValueError):
            raise ValueError(f"cannot read a cluster from {devices!r}") from None
    raise ValueError("devices must be a list of device dicts (as the probe reports them) or a dict with "
                     "devices_per_node, nodes, device_memory_bytes")


def _checked(cluster: Cluster) -> Cluster:
    if not (0 < cluster.devices_per_node <= MAX_DEVICES_PER_NODE and 0 < cluster.devices <= MAX_DEVICES):
        raise ValueError(f"the planner handles 1..{MAX_DEVICES_PER_NODE} devices per node and up to {MAX_DEVICES} "
                         f"devices in all, got {cluster.devices_per_node} x {cluster.nodes}")
    if cluster.device_memory_bytes <= 0:
        raise ValueError("device memory must be a positive number of bytes")
    bandwidth = cluster.memory_bandwidth_bytes_per_s
    if bandwidth is not None and not (isinstance(bandwidth, int | float) and bandwidth > 0):
        raise ValueError("memory bandwidth must be a positive number of bytes per second")
    return cluster


def bandwidth_of(cluster: Cluster) -> dict:
    if cluster.memory_bandwidth_bytes_per_s:
        return {"bytes_per_s": cluster.memory_bandwidth_bytes_per_s,
                "source": "the figure given for this cluster (measured by its env check or entered)"}
    named = published_peak(cluster.device_name)
    if named:
        return {"bytes_per_s": named["memory_bandwidth"],
                "source": f"published: {named['source']}, matched by name {cluster.device_name!r}"}
    matches = peaks_by_memory(cluster.device_memory_bytes)
    if matches:
        slowest = min(matches, key=lambda peak: peak["memory_bandwidth"])
        also = f" (the slowest of {', '.join(peak['matched'] for peak in matches)})" if len(matches) > 1 else ""
        return {"bytes_per_s": slowest["memory_bandwidth"],
                "source": f"published: {slowest['source']}; device assumed to be {slowest['matched']}{also} "
                          f"from its memory size"}
    return {"bytes_per_s": DEFAULT_BANDWIDTH,
            "source": "no measured or published figure for this device: A100-80GB's 2.039 TB/s assumed"}


@dataclass(frozen=True)
class PlannerModel:
    """Per-layer byte counts at one precision, and the dimensions divisibility and activations need."""

    layers: int
    heads: int | None
    kv_heads: int | None
    mla: bool
    experts: int
    experts_per_token: int
    hidden: int
    vocab: int
    ffn_width: int
    sharded: tuple[int, ...]      # per layer: attention, SSM, dense MLP, shared experts (split by TP)
    replicated: tuple[int, ...]   # per layer: norms, router
    expert: tuple[int, ...]       # per layer: routed experts (split by EP, or by TP without EP)
    embedding: int
    output_head: int              # the lm_head, or the embedding table again when they are tied
    tied: bool
    top_replicated: int           # final norm and other tensors outside the layers
    kv: KvCache


def planner_model(records: list[TensorRecord], view: ConfigView, layout: Layout, kv: KvCache,
                  precision: str) -> PlannerModel:
    chosen = precision_named(precision)
    layers = len(layout.layers)
    sharded, replicated, expert = [0] * layers, [0] * layers, [0] * layers
    embedding = lm_head = top = 0
    for record in records:
        size = tensor_bytes(record, chosen)
        if record.component == "embeddings":
            embedding += size
        elif record.component == "lm_head":
            lm_head += size
        elif record.layer is None or record.layer >= layers:
            top += size
        elif record.component == "routed_experts":
            expert[record.layer] += size
        elif record.component in ("norms", "router"):
            replicated[record.layer] += size
        else:
            sharded[record.layer] += size
    heads = view.dim("num_heads")
    top_k = view.dim("experts_per_token", 0)
    moe_width = view.dim("moe_intermediate_size") or view.dim("intermediate_size") or 0
    shared_width = view.dim("shared_expert_intermediate_size") or view.dim("num_shared_experts", 0) * moe_width
    dense_width = view.dim("dense_intermediate_size") or view.dim("intermediate_size") or 4 * view.dim("hidden_size")
    return PlannerModel(
        layers, heads, view.dim("num_kv_heads", heads), bool(view.dim("kv_lora_rank")), view.dim("num_experts", 0),
        top_k, view.dim("hidden_size"), view.dim("vocab_size"),
        max(dense_width, top_k * moe_width + shared_width) if layout.moe_layers else dense_width,
        tuple(sharded), tuple(replicated), tuple(expert), embedding, lm_head or embedding, not lm_head, top, kv)


# What a PlannerModel is besides its byte counts: the same at every precision.
DIMENSIONS = ("layers", "heads", "kv_heads", "mla", "experts", "experts_per_token", "hidden", "vocab", "ffn_width",
              "tied")
BYTE_COUNTS = ("sharded", "replicated", "expert", "embedding", "output_head", "top_replicated")


def planner_inputs(records: list[TensorRecord], view: ConfigView, layout: Layout, kv: KvCache) -> dict:
    """What the planner needs of a model, as JSON: its dimensions, its byte counts at every precision and its KV
    cache per layer. The analysis stores it, so a plan for any cluster is made from the stored analysis
    (``plan_from_analysis``) without building the model again (nor importing torch or transformers)."""
    models = {name: planner_model(records, view, layout, kv, name) for name in PRECISIONS}
    any_model = next(iter(models.values()))
    return {
        **{name: getattr(any_model, name) for name in DIMENSIONS},
        "bytes": {precision: {name: _json(getattr(model, name)) for name in BYTE_COUNTS}
                  for precision, model in models.items()},
        "kv_layers": [asdict(layer) for layer in kv.layers],
    }


def _json(value):
    return list(value) if isinstance(value, tuple) else value


def _model_from_inputs(inputs: dict, precision: str) -> PlannerModel:
    precision_named(precision)
    counts = inputs["bytes"][precision]
    return PlannerModel(**{name: inputs[name] for name in DIMENSIONS},
                        **{name: tuple(value) if isinstance(value, list) else value for name, value in counts.items()},
                        kv=KvCache(tuple(KvLayer(**layer) for layer in inputs["kv_layers"])))


def workload_from(workload: dict | None) -> Workload:
    try:
        return Workload(**(workload or {}))
    except TypeError as error:
        raise ValueError(f"workload: {error}") from None


def plan_from_analysis(analysis: dict, devices, precision: str = "bf16", workload: dict | None = None) -> dict:
    """The plans of a stored analysis (``analyze``'s report, its ``planner`` block) on ``devices`` (as
    ``cluster_from`` reads them) at ``precision``. Raises ValueError for an unknown precision, a malformed cluster
    or workload, KeyError for an analysis made before reports had a ``planner`` block."""
    model = _model_from_inputs(analysis["planner"], precision)
    return plan(model, cluster_from(devices), precision, workload_from(workload))


def _divisors(number: int) -> list[int]:
    return [value for value in range(1, number + 1) if number % value == 0]


def _expected_share_touched(tokens: int, experts: int, top_k: int) -> float:
    """Share of a layer's experts that at least one of ``tokens`` tokens is routed to, if routing is uniform."""
    if not experts:
        return 1.0
    return 1.0 - (1.0 - top_k / experts) ** max(tokens, 1)


class LayoutEvaluator:
    def __init__(self, model: PlannerModel, cluster: Cluster, workload: Workload, bandwidth: float):
        self.model, self.cluster, self.workload, self.bandwidth = model, cluster, workload, bandwidth
        self.usable = int(cluster.device_memory_bytes * USABLE_FRACTION)
        self.prefix = {name: [0, *accumulate(getattr(model, name))] for name in ("sharded", "replicated", "expert")}
        self._kv: dict[tuple[int, int], list[tuple[float, int]]] = {}

    def _stage_sum(self, name: str, start: int, stop: int) -> int:
        return self.prefix[name][stop] - self.prefix[name][start]

    def _stage_kv(self, tp: int, pp: int) -> list[tuple[float, int]]:
        """Per stage: one sequence's cache at the target context, and one token's, on one device (DP-independent)."""
        if (tp, pp) not in self._kv:
            per_stage, kv, workload = self.model.layers // pp, self.model.kv, self.workload
            self._kv[tp, pp] = [
                (kv.bytes_per_sequence(workload.context_tokens, workload.kv_precision, tp, layers),
                 kv.bytes_per_token(workload.kv_precision, tensor_parallel=tp, layers=layers))
                for layers in (slice(stage * per_stage, (stage + 1) * per_stage) for stage in range(pp))]
        return self._kv[tp, pp]

    def refusal(self, tp: int, pp: int, ep: int) -> str | None:
        """Why a layout cannot run this model, or None."""
        model = self.model
        if model.heads and model.heads % tp:
            return f"{model.heads} attention heads are not divisible by TP {tp}"
        if model.kv_heads and not model.mla and model.kv_heads % tp and tp % model.kv_heads:
            return f"{model.kv_heads} KV heads and TP {tp}: neither divides the other"
        if model.layers % pp:
            return f"{model.layers} layers do not split into {pp} equal pipeline stages"
        if ep > 1 and model.experts % ep:
            return f"{model.experts} experts are not divisible by EP {ep}"
        return None

    def evaluate(self, tp: int, pp: int, dp: int, ep: int) -> dict:
        model, workload = self.model, self.workload
        per_stage = model.layers // pp
        sequences = math.ceil(workload.concurrency / dp)
        expert_split = ep if ep > 1 else tp
        # With EP every token of every replica passes the stage's experts; without, each replica routes its own.
        routed_tokens = workload.concurrency if ep > 1 else sequences
        touched = _expected_share_touched(routed_tokens, model.experts, model.experts_per_token)
        activations = int(PREFILL_CHUNK_TOKENS * (4 * model.hidden + 2 * model.ffn_width / tp) * 2
                          + sequences * model.vocab / tp * 4)
        stages, step_bytes = [], 0.0
        for stage, (sequence_kv, per_token) in enumerate(self._stage_kv(tp, pp)):
            start, stop = stage * per_stage, (stage + 1) * per_stage
            sharded = self._stage_sum("sharded", start, stop) / tp
            replicated = self._stage_sum("replicated", start, stop)
            expert = self._stage_sum("expert", start, stop) / expert_split
            last = stage == pp - 1
            # A tied table is stored once when one stage holds both ends, and copied to the last stage otherwise.
            head = model.output_head / tp if last and (pp > 1 or not model.tied) else 0
            ends = (model.embedding / tp if stage == 0 else 0) + head + (model.top_replicated if last else 0)
            weights = sharded + replicated + expert + ends
            kv = sequences * sequence_kv
            total = weights + kv + activations + RUNTIME_OVERHEAD_BYTES
            stages.append({"weights": weights, "kv": kv, "total": total, "per_token": per_token})
            # Decode reads the touched weights (not the input embedding table: one row per token) and the KV.
            read = sharded + replicated + expert * touched + (
                model.output_head / tp + model.top_replicated if last else 0) + kv
            step_bytes += read
        binding = max(stages, key=lambda entry: entry["total"])
        free = min(self.usable - (entry["weights"] + activations + RUNTIME_OVERHEAD_BYTES) for entry in stages)
        per_token = max(entry["per_token"] for entry in stages)
        step_seconds = step_bytes / self.bandwidth
        devices = tp * pp * dp
        return {
            "tp": tp, "pp": pp, "dp": dp, "ep": ep,
            "devices": devices,
            "nodes": math.ceil(devices / self.cluster.devices_per_node),
            "fits": binding["total"] <= self.usable,
            "per_device_bytes": {
                "weights": int(binding["weights"]),
                "kv_cache": int(binding["kv"]),
                "activations": activations,
                "runtime_overhead": RUNTIME_OVERHEAD_BYTES,
                "total": int(binding["total"]),
                "usable": self.usable,
                "headroom": int(self.usable - binding["total"]),
            },
            "kv_capacity_tokens": int(max(free, 0) // per_token * dp) if per_token else None,
            "decode_tokens_per_s": round(workload.concurrency / step_seconds, 1),
            "inter_token_latency_ms": round(step_seconds * 1000, 2),
            "notes": self._notes(tp, dp, ep),
        }

    def _notes(self, tp: int, dp: int, ep: int) -> list[str]:
        model, notes = self.model, []
        if model.mla and tp > 1:
            notes.append(f"the MLA latent cache is kept whole on each of the {tp} TP ranks")
        elif model.kv_heads and tp > model.kv_heads:
            notes.append(f"TP {tp} > {model.kv_heads} KV heads: each KV head is replicated on {tp // model.kv_heads} "
                         "ranks")
        if ep > 1:
            notes.append(f"{model.experts} experts over EP {ep}: {model.experts // ep} per device; attention is "
                         f"data-parallel over {dp} replicas" if dp > 1 else
                         f"{model.experts} experts over EP {ep}: {model.experts // ep} per device")
        return notes


def _layouts(evaluator: LayoutEvaluator, max_devices: int, min_devices: int = 1):
    cluster, model = evaluator.cluster, evaluator.model
    for tp in _divisors(cluster.devices_per_node):
        for pp in _divisors(model.layers):
            if tp * pp > max_devices:
                continue
            # A replica without a sequence of its own serves nothing: DP stops at the concurrency.
            for dp in range(1, min(max_devices // (tp * pp), evaluator.workload.concurrency) + 1):
                if tp * pp * dp < min_devices:
                    continue
                for ep in sorted({1, tp * dp} if model.experts else {1}):
                    if evaluator.refusal(tp, pp, ep) is None:
                        yield evaluator.evaluate(tp, pp, dp, ep)


def _ranked(layouts: list[dict]) -> list[dict]:
    return sorted(layouts, key=lambda layout: (-layout["decode_tokens_per_s"], layout["devices"]))


def _smallest(fitting: list[dict]) -> tuple[int | None, list[dict]]:
    if not fitting:
        return None, []
    fewest = min(layout["devices"] for layout in fitting)
    return fewest, _ranked([layout for layout in fitting if layout["devices"] == fewest])


def _shortfall(layouts: list[dict], devices: int) -> str:
    if not layouts:
        return f"no layout of {devices} devices satisfies the divisibility rules"
    best = min(layouts, key=lambda layout: layout["per_device_bytes"]["total"])
    memory = best["per_device_bytes"]
    return (f"the leanest layout of up to {devices} devices (tp={best['tp']} pp={best['pp']} dp={best['dp']} "
            f"ep={best['ep']}) needs {memory['total'] / GIB:.1f} GiB per device "
            f"(weights {memory['weights'] / GIB:.1f} GiB) but {memory['usable'] / GIB:.1f} GiB is usable")


def plan(model: PlannerModel, cluster: Cluster, precision: str, workload: Workload) -> dict:
    bandwidth = bandwidth_of(cluster)
    evaluator = LayoutEvaluator(model, cluster, workload, bandwidth["bytes_per_s"])
    layouts = list(_layouts(evaluator, cluster.devices))
    fitting = [layout for layout in layouts if layout["fits"]]
    one_node = [layout for layout in layouts if layout["devices"] <= cluster.devices_per_node]
    one_node_fitting = [layout for layout in one_node if layout["fits"]]
    minimum, smallest = _smallest(fitting)
    nodes_needed = max(layout["nodes"] for layout in smallest) if smallest else None
    if not fitting:
        for nodes in range(cluster.nodes + 1, min(MAX_NODES_SEARCHED, MAX_DEVICES // cluster.devices_per_node) + 1):
            bigger = Cluster(cluster.devices_per_node, nodes, cluster.device_memory_bytes,
                             cluster.memory_bandwidth_bytes_per_s, cluster.device_name)
            grown = LayoutEvaluator(model, bigger, workload, bandwidth["bytes_per_s"])
            candidates = [layout for layout in _layouts(grown, bigger.devices, cluster.devices + 1) if layout["fits"]]
            if candidates:
                minimum, smallest = _smallest(candidates)
                nodes_needed = nodes
                break
    return {
        "precision": precision,
        "cluster": asdict(cluster),
        "workload": asdict(workload),
        "memory_bandwidth": bandwidth,
        "fits": bool(fitting),
        "reason": None if fitting else _shortfall(layouts, cluster.devices),
        "one_node": {"fits": bool(one_node_fitting),
                     "best": _ranked(one_node_fitting)[0] if one_node_fitting else None,
                     "reason": None if one_node_fitting else _shortfall(one_node, cluster.devices_per_node)},
        "minimum_devices": minimum,
        "nodes_needed": nodes_needed,
        "smallest_layouts": smallest[:5],
        "layouts": _ranked(fitting)[:LAYOUTS_LISTED],
        "layouts_considered": len(layouts),
        "layouts_fitting": len(fitting),
        "assumptions": {
            "usable_memory_fraction": USABLE_FRACTION,
            "runtime_overhead_bytes_per_device": RUNTIME_OVERHEAD_BYTES,
            "activations": f"{PREFILL_CHUNK_TOKENS}-token prefill chunk x (4 x hidden + 2 x FFN width / TP) x 2 bytes "
                           "+ fp32 logits of the decode batch (vocabulary / TP)",
            "kv_cache": f"{workload.concurrency} sequences of {workload.context_tokens} tokens in "
                        f"{workload.kv_precision}, split over the DP replicas",
            "weights": f"{precision}; embeddings, lm_head, routers and norms in bf16",
            "tensor_parallel": "inside a node; pipeline and expert parallelism may span nodes",
            "pipeline_parallel": "equal stages only (pp divides the layer count)",
            "experts_touched_per_step": "uniform routing: a layer's expert is read if any token of the step "
                                        "picks it",
            "decode_roofline": "memory-bandwidth bound; compute, communication and scheduling ignored",
        },
    }
