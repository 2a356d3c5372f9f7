"""What a sweep stores, as types: the trial of a proxy sweep and of a real engine's sweep or an endpoint benchmark,
their serving metrics, a trial's roofline entry and the efficiency rule, and the whole results.

The engine writes its results as JSON (a node sends them, the control plane stores them on the stage run); every
reader reads them back through these types, never by digging in the dicts. ``from_dict`` tolerates what results
stored before a key existed lack (the key takes its default) and keeps keys it does not know in ``extra``, so
``as_dict`` gives back what was read. Plain data: no torch, no Django.

The efficiency rule lives here once (``Efficiency``): efficiency = roofline ceiling seconds / measured seconds (with
the per-step overhead taken out where a sweep fitted one, see ``roofline``); above 1 it cannot be true, so it is
flagged and shown as the ratio by which the ceiling is beaten, never as an efficiency.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

OVER_CEILING = "over_ceiling"
OVERHEAD_EXPLAINS_ALL = "overhead_explains_all"
FLAGS = {
    OVER_CEILING: "measured faster than the predicted ceiling once the per-step overhead is taken out: the bandwidth "
                  "or FLOP/s figures understate this device for this working set (weights that fit in a cache, "
                  "figures measured under load), or the overhead fit overstates this trial's",
    OVERHEAD_EXPLAINS_ALL: "the fitted per-step overhead accounts for all of the measured time: nothing is left "
                           "to judge the hardware by",
}
# A prediction with no per-step overhead taken out (the serving recipe's) explains a flag without the overhead fit.
FLAGS_WITHOUT_OVERHEAD = {
    OVER_CEILING: "measured faster than the predicted ceiling: the bandwidth or FLOP/s figures understate this device "
                  "for this working set (measured under contention, or the weights fit in a cache)",
}


def read_with(reader):
    """A field read from the stored JSON by ``reader`` (a nested type's ``from_dict``, or ``many(type)``)."""
    return {"read": reader}


def many(record_type):
    """Reads a stored list of ``record_type`` (a missing list is empty)."""
    return lambda items: [record_type.from_dict(item) for item in items or [] if isinstance(item, dict)]


def _plain(value):
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


@dataclass(kw_only=True)
class Record:
    """A stored JSON object as a dataclass: each field is a key (a missing key takes the field's default), the keys
    no field names are kept in ``extra`` (``as_dict`` writes them back)."""

    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data):
        """The record of a stored object, or None when nothing (or not an object) was stored."""
        if not isinstance(data, dict):
            return None
        declared = {item.name: item for item in fields(cls) if item.name != "extra"}
        values = {}
        for name, declaration in declared.items():
            # A null where a list or an object belongs reads as an empty one, as a missing key does.
            if data.get(name) is not None or (name in data and declaration.default_factory is MISSING):
                reader = declaration.metadata.get("read")
                values[name] = reader(data[name]) if reader else data[name]
        return cls(**values, extra={key: value for key, value in data.items() if key not in declared})

    def as_dict(self) -> dict:
        plain = {item.name: _plain(getattr(self, item.name)) for item in fields(self) if item.name != "extra"}
        return {**plain, **self.extra}


@dataclass(kw_only=True)
class Distribution(Record):
    """A latency's mean and percentiles over a trial's requests (``metrics.distribution``), in seconds."""

    mean: float | None = None
    count: int | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


@dataclass(kw_only=True)
class Metrics(Record):
    """A trial's serving metrics, as ``metrics.summarize`` defines them (vLLM's definitions), plus its peak memory."""

    completed: int | None = None
    failed: int | None = None
    duration_s: float | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    output_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    total_tokens_per_s: float | None = None
    ttft_s: Distribution | None = field(default=None, metadata=read_with(Distribution.from_dict))
    tpot_s: Distribution | None = field(default=None, metadata=read_with(Distribution.from_dict))
    itl_s: Distribution | None = field(default=None, metadata=read_with(Distribution.from_dict))
    e2e_latency_s: Distribution | None = field(default=None, metadata=read_with(Distribution.from_dict))
    # Every completed request's end-to-end latency, sorted (absent from reports stored before it was kept).
    e2e_latency_samples_s: list | None = None
    slo: dict | None = None
    good_requests: int | None = None
    goodput_requests_per_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: str | None = None
    # The proxy's: its weights and its paged KV cache, in bytes.
    weight_bytes: int | None = None
    kv_cache_bytes: int | None = None


@dataclass(frozen=True)
class Efficiency:
    """The efficiency rule, and how a trial's efficiency reads: ``figure`` is the efficiency shown (None when
    flagged), ``ceiling_ratio`` how many times faster than the ceiling a flagged trial measured, ``flag`` why it is
    flagged (``over_ceiling``: above 1, which cannot be true; ``overhead_explains_all``: no time left once the
    overhead is out), ``note`` the flag explained. Stored as the keys efficiency, ceiling_ratio, flag and note of a
    roofline entry or a recipe's prediction."""

    figure: float | None = None
    ceiling_ratio: float | None = None
    flag: str | None = None
    note: str | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("efficiency", "ceiling_ratio", "flag", "note")

    @classmethod
    def judge(cls, ceiling_seconds: float, measured_seconds: float, *, overhead_out: bool = True) -> Efficiency:
        """The rule: ceiling / measured seconds (``measured_seconds`` with any per-step overhead already taken out;
        ``overhead_out`` says whether one was, which the note explains)."""
        ratio = ceiling_seconds / measured_seconds if measured_seconds > 0 else None
        flag = OVERHEAD_EXPLAINS_ALL if ratio is None else OVER_CEILING if ratio > 1 else None
        notes = FLAGS if overhead_out else FLAGS_WITHOUT_OVERHEAD
        return cls(figure=None if flag else ratio, ceiling_ratio=ratio if flag else None, flag=flag,
                   note=notes.get(flag))

    @classmethod
    def read(cls, stored: dict) -> Efficiency:
        """A stored entry's efficiency. Entries stored before flags existed hold a figure above 1 unflagged, and a
        recipe's prediction kept the ratio beside an unflagged efficiency: both read as the rule has them."""
        flag, note = stored.get("flag"), stored.get("note")
        ratio = stored.get("ceiling_ratio")
        if ratio is None:
            ratio = stored.get("efficiency")
        if flag is None and ratio is not None and ratio > 1:
            flag = OVER_CEILING
        return cls(figure=None if flag else ratio, ceiling_ratio=ratio if flag else None, flag=flag,
                   note=note or FLAGS.get(flag))

    @property
    def flagged(self) -> bool:
        return self.flag is not None

    @property
    def overhead_explains_all(self) -> bool:
        return self.flag == OVERHEAD_EXPLAINS_ALL

    @property
    def text(self) -> str:
        """The short form, for a table's cell."""
        if self.overhead_explains_all:
            return "overhead explains all of its time"
        if self.flagged:
            return f"ceiling suspect ({self.ceiling_ratio:.2f}×)" if self.ceiling_ratio else "ceiling suspect"
        return "—" if self.figure is None else f"{self.figure:.2f}"

    @property
    def sentence(self) -> str:
        """The long form, for a report's summary of a trial."""
        if self.overhead_explains_all:
            return "roofline: overhead explains all of its time"
        if self.flagged:
            return (f"roofline ceiling suspect: measured {self.ceiling_ratio:.2f}× faster than it" if self.ceiling_ratio
                    else "roofline ceiling suspect")
        return "no roofline efficiency" if self.figure is None else f"roofline efficiency {self.figure:.2f}"

    def as_dict(self) -> dict:
        return {"efficiency": self.figure, "ceiling_ratio": self.ceiling_ratio, "flag": self.flag, "note": self.note}


@dataclass(kw_only=True)
class Roofline(Record):
    """A trial's roofline entry (``roofline.predict``, ``evaluation.roofline_entry``, ``roofline.separate_overhead``):
    the predicted ceiling next to what was measured, the per-step overhead taken out, and the efficiency."""

    prefill: dict | None = None
    decode: dict | None = None
    arithmetic_intensity: float | None = None
    ridge_point: float | None = None
    bound: str | None = None
    predicted_seconds: float | None = None
    measured_seconds: float | None = None
    steps: int | None = None
    predicted_steps: int | None = None
    steps_from: str | None = None
    measured_decode_step_seconds: float | None = None
    flops_per_s: float | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    model: dict | None = None
    overhead_seconds: float | None = None
    overhead_seconds_per_step: float | None = None
    hardware_seconds: float | None = None
    end_to_end_efficiency: float | None = None
    efficiency: Efficiency = field(default_factory=Efficiency)
    decode_step_efficiency: float | None = None

    @classmethod
    def from_dict(cls, data):
        if not isinstance(data, dict):
            return None
        rest = {key: value for key, value in data.items() if key not in Efficiency.KEYS}
        record = super().from_dict(rest)
        record.efficiency = Efficiency.read(data)
        return record

    def as_dict(self) -> dict:
        plain = super().as_dict()
        plain.update(plain.pop("efficiency"))
        return plain

    @property
    def roof(self) -> float | None:
        """The ceiling over this trial in FLOP/s: bandwidth x intensity when memory-bound, else the FLOP/s."""
        if self.bound == "memory-bound":
            return self.arithmetic_intensity * self.memory_bandwidth_bytes_per_s
        return self.flops_per_s


@dataclass(kw_only=True)
class Repeats(Record):
    """A trial's runs (``runner.repeated``): each run's output tokens/s, and the spread (max - min) / median."""

    count: int | None = None
    output_tokens_per_s: list = field(default_factory=list)
    min: float | None = None
    max: float | None = None
    median: float | None = None
    spread: float | None = None
    ttft_p50_s: list = field(default_factory=list)


@dataclass(kw_only=True)
class TrialWorkload(Record):
    """What a trial served: its measured requests (a smart search's short runs serve fewer), arrivals and the
    requests in flight (serving trials)."""

    requests: int | None = None
    arrival: str | None = None
    concurrency: int | None = None


@dataclass(kw_only=True)
class SweepTrial(Record):
    """A proxy sweep's trial: one configuration (``params``: precision, batch_size, page_size, max_batch_tokens)
    served ``repeats`` times, the median run's figures. ``status``: ok, oom, unsupported, failed or skipped."""

    id: int | None = None
    rung: int | None = None
    params: dict = field(default_factory=dict)
    workload: TrialWorkload | None = field(default=None, metadata=read_with(TrialWorkload.from_dict))
    status: str | None = None
    reason: str | None = None
    metrics: Metrics | None = field(default=None, metadata=read_with(Metrics.from_dict))
    roofline: Roofline | None = field(default=None, metadata=read_with(Roofline.from_dict))
    details: dict = field(default_factory=dict)
    repeats: Repeats | None = field(default=None, metadata=read_with(Repeats.from_dict))

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.metrics is not None

    @property
    def efficiency(self) -> Efficiency | None:
        return self.roofline.efficiency if self.roofline else None


@dataclass(kw_only=True)
class Finalist(Record):
    """A configuration a verdict judged (``verdict.judge``): its runs of the deciding figure with their count,
    median, mean, range and relative spread ((max - min) / median), and what names it: a proxy trial's ``id`` and
    ``params``, an engine sweep's ``settings``, ``client`` and ``trial_ids``."""

    runs: list = field(default_factory=list)
    count: int | None = None
    median: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    spread: float | None = None
    id: int | None = None
    params: dict | None = None
    settings: dict | None = None
    client: dict | None = None
    trial_ids: list | None = None

    # What names a finalist: a proxy's or an engine's, never both; the other kind's stays out of the stored form.
    NAMES: ClassVar[tuple[str, ...]] = ("id", "params", "settings", "client", "trial_ids")

    def as_dict(self) -> dict:
        return {key: value for key, value in super().as_dict().items() if key not in self.NAMES or value is not None}

    @property
    def label(self) -> str:
        """The configuration in a few words, for a sentence."""
        if self.params:
            params = self.params
            return (f"trial {self.id} ({params.get('precision')}, batch size {params.get('batch_size')}, "
                    f"page size {params.get('page_size')}, max batch tokens {params.get('max_batch_tokens')})")
        named = {**(self.settings or {}), **(self.client or {})}
        return ", ".join(f"{key}={value}" for key, value in named.items()) or "the engine's defaults"


@dataclass(kw_only=True)
class Verdict(Record):
    """Whether a sweep's winner is one (``verdict.judge``): ``verdict`` confirmed, "inconclusive at this noise" or
    uncontested, the ``figure`` judged, how its ``interval`` is drawn, the ``winner`` and ``runner_up`` and the
    ``reason`` in a sentence."""

    verdict: str | None = None
    figure: str | None = None
    interval: str | None = None
    winner: Finalist | None = field(default=None, metadata=read_with(Finalist.from_dict))
    runner_up: Finalist | None = field(default=None, metadata=read_with(Finalist.from_dict))
    reason: str | None = None

    FIGURE_NAMES: ClassVar[dict[str, str]] = {"output_tokens_per_s": "output tokens/s",
                                               "goodput_requests_per_s": "goodput (requests/s)"}

    @property
    def confirmed(self) -> bool:
        return self.verdict == "confirmed"

    @property
    def figure_name(self) -> str:
        return self.FIGURE_NAMES.get(self.figure, self.figure or "?")

    @property
    def roles(self) -> list[tuple[str, Finalist]]:
        """The winner and the runner-up (when there is one), named by their role: a report's rows."""
        return [(role, finalist) for role, finalist in (("winner", self.winner), ("runner-up", self.runner_up))
                if finalist is not None]


@dataclass(kw_only=True)
class BestTrial(Record):
    """A sweep's pick: the first-pass trial's id and configuration with the figures it was re-measured at."""

    id: int | None = None
    params: dict = field(default_factory=dict)
    metrics: Metrics | None = field(default=None, metadata=read_with(Metrics.from_dict))
    roofline: Roofline | None = field(default=None, metadata=read_with(Roofline.from_dict))
    repeats: Repeats | None = field(default=None, metadata=read_with(Repeats.from_dict))
    first_pass_output_tokens_per_s: float | None = None
    # Confirmed by the verdict (before verdicts were stored, it meant re-measured, which ``remeasured`` says now).
    confirmed: bool | None = None
    remeasured: bool | None = None

    @property
    def efficiency(self) -> Efficiency | None:
        return self.roofline.efficiency if self.roofline else None


def served(trials: list) -> str:
    """How many of the trials served their workload, as an outcome says it."""
    return f"{sum(trial.status == 'ok' for trial in trials)} of {len(trials)} trials served"


@dataclass(kw_only=True)
class SweepResult(Record):
    """A proxy sweep's result (``runner.run_sweep``)."""

    model: dict = field(default_factory=dict)
    backend: Any = None
    serving_paths: dict = field(default_factory=dict)
    backends: dict = field(default_factory=dict)
    grid: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)
    repeats: int | None = None
    trials: list[SweepTrial] = field(default_factory=list, metadata=read_with(many(SweepTrial)))
    best: BestTrial | None = field(default=None, metadata=read_with(BestTrial.from_dict))
    confirmation: dict | None = None
    # The verdict over the re-measured finalists (absent from reports stored before verdicts).
    verdict: Verdict | None = field(default=None, metadata=read_with(Verdict.from_dict))
    # Page size and max batch tokens where the static path served (they do nothing there): given, served at, why.
    knobs_not_swept: dict | None = None
    # The bandwidth and FLOP/s the roofline used, where each came from, the per-step overhead fit, the formulas.
    roofline: dict = field(default_factory=dict)
    metric_definitions: dict = field(default_factory=dict)

    @property
    def ok_trials(self) -> list[SweepTrial]:
        return [trial for trial in self.trials if trial.ok]

    def remeasured(self, trial_id) -> Repeats | None:
        """The runs a confirmation candidate was re-measured at (what the verdict judged), or None for a trial that
        was not re-measured (or was, before the runs were stored)."""
        for row in (self.confirmation or {}).get("candidates") or []:
            if row.get("id") == trial_id and row.get("status") == "ok" and row.get("repeats"):
                return Repeats.from_dict(row["repeats"])
        return None

    @property
    def over_ceiling(self) -> int:
        """How many trials' efficiencies are flagged."""
        return sum(bool(trial.efficiency and trial.efficiency.flagged) for trial in self.trials)


@dataclass(kw_only=True)
class Goodput(Record):
    """A configuration's goodput search (``serving.goodput``): the highest load (``over``: a Poisson ``rate`` or a
    closed loop's ``concurrency``) that met the SLOs, the goodput (that rate; for concurrency the requests/s measured
    there) and per device (TP x PP x DP), the requests/s measured at that load, the runs it took and their serving
    seconds, and ``rate_sweep``: every run's load, percentiles in ms (``ttft_p95_ms``...), requests/s and whether it
    met the SLOs, ordered by load."""

    over: str | None = None
    max_load_meeting_slo: float | None = None
    goodput_requests_per_s: float | None = None
    measured_requests_per_s: float | None = None
    devices: int | None = None
    goodput_per_device: float | None = None
    runs: int | None = None
    serving_s: float | None = None
    rate_sweep: list = field(default_factory=list)


@dataclass(kw_only=True)
class ServingTrial(Record):
    """A trial of a real engine's sweep (``serving.serve_sweep``: one engine start's ``settings``, its ``command``
    and ``env``, the ``client`` settings it was served with) or of an endpoint benchmark (``client`` only).
    ``cause``: why a failed trial failed (out of memory, timed out...), read from the engine's log."""

    id: int | None = None
    rung: int | None = None
    settings: dict | None = None
    command: str | None = None
    env: dict | None = None
    client: dict = field(default_factory=dict)
    status: str | None = None
    cause: str | None = None
    reason: str | None = None
    startup_s: float | None = None
    metrics: Metrics | None = field(default=None, metadata=read_with(Metrics.from_dict))
    client_cpu_s_per_request: float | None = None
    workload: TrialWorkload | None = field(default=None, metadata=read_with(TrialWorkload.from_dict))
    log_tail: str | None = None
    # Served again after the search so that a finalist has 3 runs for the verdict (``serve_sweep.repeat_finalists``).
    repeat: bool | None = None
    # Where the workload asked for a goodput search: its outcome (the metrics are those of its best run).
    goodput: Goodput | None = field(default=None, metadata=read_with(Goodput.from_dict))
    # On real weights, its numerics' check against the reference (``quality.QualityCheck.mark``): the verdict
    # (pass, failed-correctness, failed-accuracy, under-recovery) and the numerics' label.
    quality: dict | None = None
    # What d0 predicted for it beside what it measured (``serving.prediction.trial_prediction``, the ledger's entry).
    prediction: dict | None = None


@dataclass(kw_only=True)
class ServingBest(Record):
    """The best serving trial's id, settings (an engine sweep's), client settings and figures."""

    id: int | None = None
    settings: dict | None = None
    client: dict = field(default_factory=dict)
    metrics: Metrics | None = field(default=None, metadata=read_with(Metrics.from_dict))
    # An engine sweep's pick: its runs of the deciding figure and their median, mean and range (``verdict.summary``).
    runs: list | None = None
    spread: dict | None = None


@dataclass(kw_only=True)
class ServeSweepResult(Record):
    """A real engine's sweep (``serving.serve_sweep.run_serve_sweep``), led by its recipe."""

    engine: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    grid: dict = field(default_factory=dict)
    configurations: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    trials: list[ServingTrial] = field(default_factory=list, metadata=read_with(many(ServingTrial)))
    best: ServingBest | None = field(default=None, metadata=read_with(ServingBest.from_dict))
    # The best configuration's engine command, environment and figures, and its roofline ``prediction``.
    recipe: dict | None = None
    correctness: dict | None = None
    engine_starts: int | None = None
    search: dict | None = None
    seconds: float | None = None
    metric_definitions: dict = field(default_factory=dict)
    # The verdict over the finalists, each served at least 3 times (absent from reports stored before verdicts).
    verdict: Verdict | None = field(default=None, metadata=read_with(Verdict.from_dict))
    # Each numerics served checked against the reference (``quality.QualityCheck.finish``: the reference, the
    # accuracy settings, an entry per numerics), or a note saying why not (random weights).
    quality: dict | None = None
    # Per numerics served, its best throughput beside its quality (``quality.variant_summary``); empty on random
    # weights.
    variants: list = field(default_factory=list)

    @property
    def grid_share(self) -> float | None:
        """A search's serving time as a share of what the full grid would have served: every trial's serving
        seconds (a goodput search's runs, else the trial's duration) over the configurations times the mean of
        the full-workload trials' (a grid serves each configuration the full workload once). An estimate: the
        configurations pruned early may have served faster or slower than those that reached the full workload.
        None for a grid, or when no trial served the full workload."""
        search = self.search or {}
        configurations = search.get("configurations")
        if search.get("strategy") in (None, "grid") or not isinstance(configurations, int) or configurations < 1:
            return None

        def seconds(trial: ServingTrial) -> float | None:
            if trial.goodput and trial.goodput.serving_s is not None:
                return trial.goodput.serving_s
            return trial.metrics.duration_s if trial.metrics else None

        served = [trial for trial in self.trials if trial.status == "ok" and seconds(trial) is not None]
        full = [seconds(trial) for trial in served
                if trial.workload and trial.workload.requests == self.workload.get("requests")]
        if not full:
            return None
        return sum(map(seconds, served)) / (configurations * sum(full) / len(full))

    @property
    def prediction_efficiency(self) -> Efficiency | None:
        """The recipe's measured throughput against its roofline ceiling, when a prediction was made."""
        prediction = (self.recipe or {}).get("prediction")
        return Efficiency.read(prediction) if prediction and prediction.get("available") else None


@dataclass(kw_only=True)
class EndpointBenchResult(Record):
    """A benchmark of an endpoint someone else runs (``serving.endpoint_bench.run_endpoint_bench``)."""

    endpoint: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    trials: list[ServingTrial] = field(default_factory=list, metadata=read_with(many(ServingTrial)))
    best: ServingBest | None = field(default=None, metadata=read_with(ServingBest.from_dict))
    seconds: float | None = None
    metric_definitions: dict = field(default_factory=dict)
