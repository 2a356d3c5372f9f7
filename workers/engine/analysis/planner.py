"""Parallel layouts for serving a model on a cluster: which tensor x pipeline x data (x expert) splits fit in
device memory with headroom, the fewest devices that do, and a decode-throughput ranking from a memory-bandwidth
roofline.

Layout model (as vLLM and SGLang deploy MoE models):
- TP shards attention, dense and shared-expert weights and the vocabulary inside a node; norms and routers are
  replicated;
- PP splits the layers into stages as vLLM does (``get_pp_indices``: as even as possible, the extra layers on the
  stages before the last; ``pipeline_stages.stage_layer_ranges``), one stage after another, across nodes or inside
  one; only the fewest stages that fit are planned for each TP x DP x EP, since more add devices, not decode rate;
- DP runs replicas, each serving concurrency / dp sequences; with EP, the replicas' attention is data-parallel
  ("DP attention") and the routed experts are spread over all tp x dp devices of a stage (ep = tp x dp, each
  device holding experts / ep whole experts); without EP the experts are TP-sharded like the dense weights. DP goes
  beyond the concurrency only with EP, where a replica without a sequence still thins every device's experts.

Each layout states its stage sizes, the per-device memory of its heaviest stage (weights, KV cache, activations,
runtime overhead) and of every stage, where its groups go, and its rank with the reason for it.

Roofline (Williams et al. 2009; decode is memory-bound): a decode step reads every device's weights that the batch
touches and its sequences' KV cache once. Stages run one after another for a token, so
step time = sum over stages of (bytes one device of the stage reads) / memory bandwidth, and
decode tokens/s = concurrency / step time. Compute, communication and scheduling are ignored, so the figure is an
upper bound used for ranking, not a forecast. The bandwidth is the cluster's own: measured by its env check (or
entered), else the published figure of the device it names. A cluster with neither has no figures: its plan says so
and predicts no decode rate (never another device's peak), and its layouts are ranked by the bytes a decode step
reads per device, which orders them as any one bandwidth would.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import asdict, dataclass
from itertools import accumulate

from ..envcheck.peaks import published_peak
from ..pipeline_stages import stage_layer_ranges
from ..models.config_loading import ConfigView
from .kv_cache import KvCache, KvLayer, kv_bytes_per_element
from ..models.layers import Layout
from .memory import PRECISIONS, precision_named, tensor_bytes
from .parameter_counts import TensorRecord

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


# What a plan says where the cluster has no figure of its own (no env check, no published figure for its device).
NO_FIGURES = ("no figures for this node: no env check has measured its memory bandwidth and no published figure "
              "matches its device's name; no decode rate is predicted (run an env check), and the layouts are ranked "
              "by the bytes a decode step reads per device")


def bandwidth_of(cluster: Cluster) -> dict:
    """The memory bandwidth the decode roofline uses: the cluster's measured (or entered) figure, else the
    published figure of the device it names; ``bytes_per_s`` None when it has neither."""
    if cluster.memory_bandwidth_bytes_per_s:
        return {"bytes_per_s": cluster.memory_bandwidth_bytes_per_s,
                "source": "the figure given for this cluster (measured by its env check or entered)"}
    named = published_peak(cluster.device_name)
    if named:
        return {"bytes_per_s": named["memory_bandwidth"],
                "source": f"published: {named['source']}, matched by name {cluster.device_name!r}"}
    # A device guessed from its memory size (or any other device's figure) would be another device's peak.
    return {"bytes_per_s": None, "source": NO_FIGURES}


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
    dense_width = view.dim("dense_intermediate_size") or view.dim("intermediate_size") or 4 * view.dim("hidden_size")
    # The widest FFN one token runs through: top-k experts plus the shared ones, per layer as the layout reads it.
    routed_width = max((mlp.top_k * mlp.expert_width + mlp.shared_width for mlp in layout.mlps if mlp.experts),
                       default=top_k * moe_width)
    return PlannerModel(
        layers, heads, view.dim("num_kv_heads", heads), bool(view.dim("kv_lora_rank")), view.dim("num_experts", 0),
        top_k, view.dim("hidden_size"), view.dim("vocab_size"),
        max(dense_width, routed_width) if layout.moe_layers else dense_width,
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


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


class LayoutEvaluator:
    """Memory and decode roofline of one layout (tp, pp, dp, ep) of a model on a cluster's devices."""

    def __init__(self, model: PlannerModel, cluster: Cluster, workload: Workload, bandwidth: float | None):
        self.model, self.cluster, self.workload, self.bandwidth = model, cluster, workload, bandwidth
        self.usable = int(cluster.device_memory_bytes * USABLE_FRACTION)
        self.prefix = {name: [0, *accumulate(getattr(model, name))] for name in ("sharded", "replicated", "expert")}
        self.evaluated = 0
        self._ranges: dict[int, list[range]] = {}
        self._sums: dict[int, list[tuple[int, int, int]]] = {}
        self._kv: dict[tuple[int, int], list[tuple[float, int]]] = {}
        self._weights: dict[tuple[int, int, int], list[tuple[float, float, float, float]]] = {}

    def stage_ranges(self, pp: int) -> list[range]:
        if pp not in self._ranges:
            self._ranges[pp] = stage_layer_ranges(self.model.layers, pp)
        return self._ranges[pp]

    def _stage_kv(self, tp: int, pp: int) -> list[tuple[float, int]]:
        """Per stage: one sequence's cache at the target context, and one token's, on one device (DP-independent)."""
        if (tp, pp) not in self._kv:
            kv, workload = self.model.kv, self.workload
            self._kv[tp, pp] = [
                (kv.bytes_per_sequence(workload.context_tokens, workload.kv_precision, tp, layers),
                 kv.bytes_per_token(workload.kv_precision, tensor_parallel=tp, layers=layers))
                for layers in (slice(stage.start, stage.stop) for stage in self.stage_ranges(pp))]
        return self._kv[tp, pp]

    def _stage_sums(self, pp: int) -> list[tuple[int, int, int]]:
        """Per stage: its layers' TP-sharded, replicated and routed-expert bytes, whole."""
        if pp not in self._sums:
            prefix = self.prefix
            self._sums[pp] = [tuple(prefix[name][layers.stop] - prefix[name][layers.start]
                                    for name in ("sharded", "replicated", "expert"))
                              for layers in self.stage_ranges(pp)]
        return self._sums[pp]

    def _stage_weights(self, tp: int, pp: int, expert_split: int) -> list[tuple[float, float, float, float]]:
        """Per stage, on one device: (TP-sharded, replicated, routed-expert, embedding/head/final-norm) bytes."""
        key = (tp, pp, expert_split)
        if key not in self._weights:
            model, stages = self.model, []
            for stage, (sharded, replicated, expert) in enumerate(self._stage_sums(pp)):
                last = stage == pp - 1
                # A tied table is stored once when one stage holds both ends, and copied to the last stage otherwise.
                head = model.output_head / tp if last and (pp > 1 or not model.tied) else 0
                ends = (model.embedding / tp if stage == 0 else 0) + head + (model.top_replicated if last else 0)
                stages.append((sharded / tp, replicated, expert / expert_split, ends))
            self._weights[key] = stages
        return self._weights[key]

    def sequences_per_replica(self, dp: int) -> int:
        """Sequences of the busiest replica (one, when there are more replicas than sequences)."""
        return math.ceil(self.workload.concurrency / dp)

    def _activation_terms(self, tp: int) -> tuple[float, float]:
        """Activation bytes on a device: a fixed prefill-chunk part, and a part per decoded sequence (fp32 logits)."""
        model = self.model
        return PREFILL_CHUNK_TOKENS * (4 * model.hidden + 2 * model.ffn_width / tp) * 2, model.vocab / tp * 4

    def _activations(self, tp: int, sequences: int) -> int:
        fixed, per_sequence = self._activation_terms(tp)
        return int(fixed + sequences * per_sequence)

    def refusal(self, tp: int, pp: int, ep: int) -> str | None:
        """Why a layout cannot run this model, or None."""
        model = self.model
        if model.heads and model.heads % tp:
            return f"{model.heads} attention heads are not divisible by TP {tp}"
        if model.kv_heads and not model.mla and model.kv_heads % tp and tp % model.kv_heads:
            return f"{model.kv_heads} KV heads and TP {tp}: neither divides the other"
        if pp > model.layers:
            return f"{model.layers} layers cannot fill {pp} pipeline stages"
        if ep > 1 and model.experts % ep:
            return f"{model.experts} experts are not divisible by EP {ep}"
        return None

    def most_sequences(self, tp: int, pp: int, expert_split: int) -> int:
        """The most sequences at the target context one replica of (tp, pp) holds with every device within the
        usable memory (-1 when the weights alone do not fit). The memory of each device is linear in its sequences,
        so one figure answers every DP size: dp fits when ceil(concurrency / dp) is at most this."""
        self.evaluated += 1
        fixed, per_sequence = self._activation_terms(tp)
        most = math.inf
        for weights, (sequence_kv, _) in zip(self._stage_weights(tp, pp, expert_split), self._stage_kv(tp, pp),
                                             strict=True):
            room = self.usable - sum(weights) - fixed - RUNTIME_OVERHEAD_BYTES
            if room < 0:
                return -1
            most = min(most, room // (sequence_kv + per_sequence))
        return int(min(most, MAX_CONCURRENCY))

    def peak_bytes(self, tp: int, pp: int, dp: int, ep: int) -> float:
        """The heaviest device's memory: its stage's weights and KV cache, activations and runtime overhead."""
        sequences = self.sequences_per_replica(dp)
        heaviest = max(sum(weights) + sequences * sequence_kv for weights, (sequence_kv, _) in
                       zip(self._stage_weights(tp, pp, ep if ep > 1 else tp), self._stage_kv(tp, pp), strict=True))
        return heaviest + self._activations(tp, sequences) + RUNTIME_OVERHEAD_BYTES

    def evaluate(self, tp: int, pp: int, dp: int, ep: int) -> dict:
        model, workload = self.model, self.workload
        sequences = self.sequences_per_replica(dp)
        # With EP every token of every replica passes the stage's experts; without, each replica routes its own.
        routed_tokens = workload.concurrency if ep > 1 else sequences
        touched = _expected_share_touched(routed_tokens, model.experts, model.experts_per_token)
        activations = self._activations(tp, sequences)
        ranges = self.stage_ranges(pp)
        stages, weights_read, kv_read = [], 0.0, 0.0
        for stage, ((sharded, replicated, expert, ends), (sequence_kv, per_token)) in enumerate(
                zip(self._stage_weights(tp, pp, ep if ep > 1 else tp), self._stage_kv(tp, pp), strict=True)):
            weights = sharded + replicated + expert + ends
            kv = sequences * sequence_kv
            stages.append({"layers": [ranges[stage].start, ranges[stage].stop - 1], "weights": int(weights),
                           "kv_cache": int(kv), "total": int(weights + kv + activations + RUNTIME_OVERHEAD_BYTES),
                           "per_token": per_token})
            # Decode reads the touched weights (not the input embedding table: one row per token) and the KV.
            last = stage == pp - 1
            weights_read += sharded + replicated + expert * touched + (
                model.output_head / tp + model.top_replicated if last else 0)
            kv_read += kv
        binding = max(range(pp), key=lambda stage: stages[stage]["total"])
        heaviest = stages[binding]
        free = min(self.usable - (entry["weights"] + activations + RUNTIME_OVERHEAD_BYTES) for entry in stages)
        per_token = max(entry.pop("per_token") for entry in stages)
        # Without a bandwidth of this node's own, no time is predicted: the bytes read still rank the layouts.
        step_seconds = (weights_read + kv_read) / self.bandwidth if self.bandwidth else None
        devices = tp * pp * dp
        return {
            "tp": tp, "pp": pp, "dp": dp, "ep": ep,
            "devices": devices,
            "nodes": math.ceil(devices / self.cluster.devices_per_node),
            "fits": heaviest["total"] <= self.usable,
            "stage_layers": [len(layers) for layers in ranges],
            "placement": self._placement(tp, pp, dp),
            "per_device_bytes": {
                "weights": heaviest["weights"],
                "kv_cache": heaviest["kv_cache"],
                "activations": activations,
                "runtime_overhead": RUNTIME_OVERHEAD_BYTES,
                "total": heaviest["total"],
                "usable": self.usable,
                "headroom": self.usable - heaviest["total"],
            },
            "heaviest_stage": binding,
            "stages": stages,
            "decode_step_read_bytes": {"weights": int(weights_read), "kv_cache": int(kv_read)},
            "kv_capacity_tokens": int(max(free, 0) // per_token * dp) if per_token else None,
            "decode_tokens_per_s": round(workload.concurrency / step_seconds, 1) if step_seconds else None,
            "inter_token_latency_ms": round(step_seconds * 1000, 2) if step_seconds else None,
            "notes": self._notes(tp, dp, ep),
        }

    def _placement(self, tp: int, pp: int, dp: int) -> str:
        """Where the groups go: a TP group inside one node (tp divides the node's devices), stages across nodes."""
        per_node, stage_devices = self.cluster.devices_per_node, tp * dp
        parts = [f"TP {tp} inside a node" if tp > 1 else "no TP"]
        if dp > 1:
            parts.append(f"{dp} replicas")
        if pp == 1:
            if stage_devices > per_node:
                parts.append(f"over {math.ceil(stage_devices / per_node)} nodes")
        elif stage_devices == per_node:
            parts.append(f"{pp} stages, one per node")
        elif stage_devices > per_node:
            parts.append(f"{pp} stages of {stage_devices / per_node:g} nodes each")
        elif per_node % stage_devices == 0:
            parts.append(f"{pp} stages, {per_node // stage_devices} per node")
        else:
            parts.append(f"{pp} stages of {stage_devices} devices, some across two nodes")
        return "; ".join(parts)

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
        if dp > self.workload.concurrency:
            notes.append(f"{dp} replicas for {self.workload.concurrency} sequence(s): the idle replicas hold experts "
                         "(EP), so each device reads fewer of them per step")
        return notes


def _expert_parallel_choices(evaluator: LayoutEvaluator, tp: int, max_devices: int):
    """(dp, ep) pairs with EP: the experts over all tp x dp devices of a stage, attention data-parallel. DP may go
    beyond the concurrency here, as in vLLM's DP16 + EP recipe for one Kimi-K2 sequence: each added replica thins
    the experts every device holds and reads per step (without EP an idle replica adds nothing)."""
    experts = evaluator.model.experts
    for dp in range(1, max_devices // tp + 1) if experts else ():
        if tp * dp > 1 and experts % (tp * dp) == 0:
            yield dp, tp * dp


def _fitting_layouts(evaluator: LayoutEvaluator, max_devices: int):
    """For each TP (a divisor of a node's devices: TP stays inside a node) x DP x EP, the layout of up to
    ``max_devices`` with the fewest pipeline stages that fits. More stages only add devices: stages decode one after
    another, so they do not raise the memory-bound decode rate."""
    model, concurrency = evaluator.model, evaluator.workload.concurrency
    for tp in _divisors(evaluator.cluster.devices_per_node):
        if evaluator.refusal(tp, 1, 1) is not None:
            continue
        # Without EP the weights do not depend on DP: the most sequences each pp holds serves every dp (up to the
        # concurrency), and the fewest stages for a dp is the first pp whose running best holds its share.
        most = LazyRunningMax(lambda pp, tp=tp: evaluator.most_sequences(tp, pp, tp))
        for dp in range(1, min(max_devices // tp, concurrency) + 1):
            pp = most.first_reaching(evaluator.sequences_per_replica(dp), min(model.layers, max_devices // (tp * dp)))
            if pp is not None:
                yield evaluator.evaluate(tp, pp, dp, 1)
        for dp, ep in _expert_parallel_choices(evaluator, tp, max_devices):
            for pp in range(1, min(model.layers, max_devices // (tp * dp)) + 1):
                if evaluator.most_sequences(tp, pp, ep) >= evaluator.sequences_per_replica(dp):
                    yield evaluator.evaluate(tp, pp, dp, ep)
                    break


class LazyRunningMax:
    """max(f(1..n)) for growing n, computed only as far as asked."""

    def __init__(self, function):
        self.function, self.running = function, []

    def first_reaching(self, target: int, limit: int) -> int | None:
        """The smallest n <= limit with f(n) >= target, or None."""
        while len(self.running) < limit and (not self.running or self.running[-1] < target):
            value = self.function(len(self.running) + 1)
            self.running.append(max(value, self.running[-1]) if self.running else value)
        index = bisect_left(self.running, target, hi=min(limit, len(self.running)))
        return index + 1 if index < min(limit, len(self.running)) else None


def _leanest(evaluator: LayoutEvaluator, devices: int) -> dict | None:
    """The layout of up to ``devices`` devices that needs the least memory per device (every split at its most)."""
    best, best_bytes = None, math.inf
    for tp in _divisors(evaluator.cluster.devices_per_node):
        without_ep = ((dp, 1) for dp in range(1, min(devices // tp, evaluator.workload.concurrency) + 1))
        for dp, ep in (*without_ep, *_expert_parallel_choices(evaluator, tp, devices)):
            pp = min(evaluator.model.layers, devices // (tp * dp))
            if pp >= 1 and evaluator.refusal(tp, pp, ep) is None:
                peak = evaluator.peak_bytes(tp, pp, dp, ep)
                if peak < best_bytes:
                    best, best_bytes = (tp, pp, dp, ep), peak
    return evaluator.evaluate(*best) if best else None


def _shortfall(evaluator: LayoutEvaluator, devices: int) -> str:
    leanest = _leanest(evaluator, devices)
    if leanest is None:
        return f"no layout of {devices} devices satisfies the divisibility rules"
    memory = leanest["per_device_bytes"]
    return (f"the leanest layout of up to {devices} devices (tp={leanest['tp']} pp={leanest['pp']} dp={leanest['dp']} "
            f"ep={leanest['ep']}) needs {memory['total'] / GIB:.1f} GiB per device "
            f"(weights {memory['weights'] / GIB:.1f} GiB) but {memory['usable'] / GIB:.1f} GiB is usable")


def _step_bytes(layout: dict) -> int:
    read = layout["decode_step_read_bytes"]
    return read["weights"] + read["kv_cache"]


def _speed_key(layout: dict) -> float:
    """Smaller is faster: minus the predicted decode rate, or (no figures for the node) the bytes a step reads."""
    rate = layout["decode_tokens_per_s"]
    return -rate if rate is not None else _step_bytes(layout)


def _ranked(layouts: list[dict]) -> list[dict]:
    """Fastest predicted decode first (the least read per step where the node has no figures); among equals,
    fewer devices, then fewer stages."""
    return sorted(layouts, key=lambda layout: (_speed_key(layout), layout["devices"], layout["pp"]))


def _read_per_step(layout: dict) -> str:
    read = layout["decode_step_read_bytes"]
    stages = f" over {layout['pp']} stages in turn" if layout["pp"] > 1 else ""
    return f"{_gib(read['weights'])} of weights + {_gib(read['kv_cache'])} of KV cache per device{stages}"


def _explain(ranked: list[dict], concurrency: int) -> list[dict]:
    """Sets each layout's ``rank`` and a short ``reason``: its decode rate and what makes it lower than the
    first's (the bytes a decode step reads per device, stage after stage), or which layout ranked above it equals
    it. Returns ``ranked``."""
    if not ranked:
        return ranked
    if ranked[0]["decode_tokens_per_s"] is None:
        return _explain_by_bytes(ranked)
    first, fewest = ranked[0], min(layout["devices"] for layout in ranked)
    first_at_rate: dict[float, dict] = {}
    for layout in ranked:
        first_at_rate.setdefault(layout["decode_tokens_per_s"], layout)
    for rank, layout in enumerate(ranked, 1):
        layout["rank"] = rank
        rate = layout["decode_tokens_per_s"]
        equal = first_at_rate[rate]
        if rank == 1:
            why = (f"the highest predicted decode rate, {rate} tok/s for {concurrency} sequence(s): each step reads "
                   f"{_read_per_step(layout)}")
        elif equal is not layout and equal["devices"] == layout["devices"]:
            why = f"ties with #{equal['rank']} ({rate} tok/s on {layout['devices']} devices)"
        elif equal is not layout:
            why = (f"as fast as #{equal['rank']} ({rate} tok/s) but on {layout['devices']} devices, "
                   f"not {equal['devices']}")
        else:
            below = 100 * (1 - rate / first["decode_tokens_per_s"])
            read = first["decode_step_read_bytes"]
            why = (f"{below:.1f}% below #1 ({rate} tok/s): each step reads {_read_per_step(layout)}, against "
                   f"{_gib(read['weights'])} + {_gib(read['kv_cache'])} for #1")
        fewest_note = "; the fewest devices that fit" if layout["devices"] == fewest else ""
        layout["reason"] = f"#{rank} of {len(ranked)} that fit: {why}{fewest_note}"
    return ranked


def _explain_by_bytes(ranked: list[dict]) -> list[dict]:
    """``_explain`` for a node with no figures: ranked by the bytes a decode step reads per device, and said so."""
    first, fewest = ranked[0], min(layout["devices"] for layout in ranked)
    first_at_bytes: dict[int, dict] = {}
    for layout in ranked:
        first_at_bytes.setdefault(_step_bytes(layout), layout)
    for rank, layout in enumerate(ranked, 1):
        layout["rank"] = rank
        equal = first_at_bytes[_step_bytes(layout)]
        if rank == 1:
            why = (f"the least read per decode step ({_read_per_step(layout)}); no figures for this node, so no "
                   "decode rate is predicted")
        elif equal is not layout and equal["devices"] == layout["devices"]:
            why = f"ties with #{equal['rank']} (as much read per decode step, on {layout['devices']} devices)"
        elif equal is not layout:
            why = f"reads as much per decode step as #{equal['rank']} but on {layout['devices']} devices, " \
                  f"not {equal['devices']}"
        else:
            more = 100 * (_step_bytes(layout) / _step_bytes(first) - 1)
            why = f"reads {more:.1f}% more per decode step than #1: {_read_per_step(layout)}"
        fewest_note = "; the fewest devices that fit" if layout["devices"] == fewest else ""
        layout["reason"] = f"#{rank} of {len(ranked)} that fit: {why}{fewest_note}"
    return ranked


def _smallest(ranked: list[dict]) -> tuple[int | None, list[dict]]:
    if not ranked:
        return None, []
    fewest = min(layout["devices"] for layout in ranked)
    return fewest, [layout for layout in ranked if layout["devices"] == fewest]


def plan(model: PlannerModel, cluster: Cluster, precision: str, workload: Workload) -> dict:
    bandwidth = bandwidth_of(cluster)
    evaluator = LayoutEvaluator(model, cluster, workload, bandwidth["bytes_per_s"])
    per_node = cluster.devices_per_node
    fitting = _explain(_ranked(list(_fitting_layouts(evaluator, cluster.devices))), workload.concurrency)
    one_node_fitting = [layout for layout in fitting if layout["devices"] <= per_node]
    minimum, smallest = _smallest(fitting)
    nodes_needed = max(layout["nodes"] for layout in smallest) if smallest else None
    searched = min(MAX_NODES_SEARCHED, MAX_DEVICES // per_node) * per_node
    if not fitting and searched > cluster.devices:
        candidates = list(_fitting_layouts(evaluator, searched))
        if candidates:
            minimum = min(layout["devices"] for layout in candidates)
            nodes_needed = math.ceil(minimum / per_node)
            # Ranked among what fits on the nodes needed, as they would be on a cluster of that size.
            ranked = _explain(_ranked([layout for layout in candidates
                                       if layout["devices"] <= nodes_needed * per_node]), workload.concurrency)
            smallest = _smallest(ranked)[1]
    return {
        "precision": precision,
        "cluster": asdict(cluster),
        "workload": asdict(workload),
        "memory_bandwidth": bandwidth,
        "fits": bool(fitting),
        "reason": None if fitting else _shortfall(evaluator, cluster.devices),
        "one_node": {"fits": bool(one_node_fitting),
                     "best": one_node_fitting[0] if one_node_fitting else None,
                     "reason": None if one_node_fitting else _shortfall(evaluator, per_node)},
        "minimum_devices": minimum,
        "nodes_needed": nodes_needed,
        "smallest_layouts": smallest[:5],
        "layouts": fitting[:LAYOUTS_LISTED],
        "layouts_considered": evaluator.evaluated,
        "layouts_fitting": len(fitting),
        "assumptions": {
            "usable_memory_fraction": USABLE_FRACTION,
            "runtime_overhead_bytes_per_device": RUNTIME_OVERHEAD_BYTES,
            "activations": f"{PREFILL_CHUNK_TOKENS}-token prefill chunk x (4 x hidden + 2 x FFN width / TP) x 2 bytes "
                           "+ fp32 logits of the decode batch (vocabulary / TP)",
            "kv_cache": f"{workload.concurrency} sequences of {workload.context_tokens} tokens in "
                        f"{workload.kv_precision}, split over the DP replicas",
            "weights": f"{precision}; embeddings, lm_head, routers and norms in bf16",
            "tensor_parallel": "inside a node (TP divides a node's devices); pipeline stages, DP replicas and EP "
                               "may span nodes",
            "pipeline_parallel": "layers split as vLLM's get_pp_indices splits them: as even as possible, the extra "
                                 "layers on the stages before the last; per TP x DP x EP only the fewest stages that "
                                 "fit (more add devices, not decode rate)",
            "data_parallel": "up to the concurrency without EP; beyond it with EP, where idle replicas still hold "
                             "and read a share of the experts",
            "experts_touched_per_step": "uniform routing: a layer's expert is read if any token of the step "
                                        "picks it",
            "decode_roofline": "memory-bandwidth bound; compute, communication and scheduling ignored",
            "ranking": "predicted decode tok/s at the workload's concurrency (without figures for the node: the "
                       "bytes a decode step reads per device), then fewer devices, then fewer stages",
        },
    }
