"""Benchmark backends: what serves a trial's requests and reports when each token came out.

A backend has a ``name``, says whether it can run here (``available()``, and ``unavailable_reason()`` when not),
and ``run(trial) -> TrialResult``: the per-request timestamps plus memory figures. Metrics and the roofline are
computed from those by the sweep, the same way for every backend. The proxy sweep has one: transformers'
continuous batching over a paged KV cache, serving the reduced model in d0's own process. Real engines (vLLM,
SGLang) are external programs driven by the ``serve_sweep`` stage (``workers.engine.serving``), not backends here.
"""

from __future__ import annotations

import gc
import math
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

import torch

from ..models.loading import build_random_model, causal_lm_config, load_config
from .metrics import RequestRecord
from .benchmark_model import SERVED_DTYPES, benchmark_config, dynamic_int8_unsupported, quantize_dynamic_int8
from .roofline import ModelCost, model_cost
from .search import TrialParams
from .workload import Request, Workload

# torch's messages for an allocation failure: CUDA/HIP/XPU/MPS say "out of memory", the CPU allocator "not enough
# memory", or "can't allocate memory" when the OS refuses (ENOMEM: the node's stage memory limit). Errors raised on
# transformers' generation thread reach us as these strings only.
OUT_OF_MEMORY_MARKERS = ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory")
# How often the request loop wakes when nothing is due, to sample memory and check the deadline.
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Trial:
    params: TrialParams
    workload: Workload


@dataclass
class TrialResult:
    """``status``: ok, oom (ran out of memory), unsupported (the backend cannot run these parameters here) or
    failed (any other error, in ``reason``); the search adds skipped for configurations it does not run."""

    params: TrialParams
    status: str
    reason: str | None = None
    records: list[RequestRecord] = field(default_factory=list)
    cost: ModelCost | None = None
    memory: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)


def is_out_of_memory(error: BaseException | str) -> bool:
    if isinstance(error, torch.OutOfMemoryError | MemoryError):  # MemoryError: Python's, under a memory limit
        return True
    return any(marker in str(error).lower() for marker in OUT_OF_MEMORY_MARKERS)


def _describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:500]


class BenchmarkBackend(ABC):
    name: str

    @classmethod
    def available(cls) -> bool:
        return cls.unavailable_reason() is None

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run on this node, or None when it can."""

    def unsupported_reason(self, params: TrialParams) -> str | None:
        """Why this backend cannot run a trial with these parameters here (recorded as "unsupported"), or None."""
        return None

    @abstractmethod
    def run(self, trial: Trial) -> TrialResult:
        """Serve the trial's workload (warm-up first, excluded) and return what was observed; never raises for an
        out-of-memory trial, which is a result (status "oom")."""

    def describe(self) -> dict:
        return {"name": self.name, "available": self.available(), "unavailable_reason": self.unavailable_reason()}


class PeakMemory:
    """The trial's peak memory: the allocator's high-water mark on accelerators; on a CPU, which has none, the
    process RSS sampled while serving (so it includes the Python process and libraries)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.module = None if device.type == "cpu" else torch.get_device_module(device.type)
        self.peak = 0

    def reset(self) -> None:
        if self.module is not None and hasattr(self.module, "reset_peak_memory_stats"):
            self.module.reset_peak_memory_stats(self.device)
        self.peak = 0
        self.sample()

    def sample(self) -> None:
        if self.module is None:
            import psutil

            self.peak = max(self.peak, psutil.Process().memory_info().rss)

    def result(self) -> dict:
        if self.module is not None and hasattr(self.module, "max_memory_allocated"):
            return {"peak_memory_bytes": self.module.max_memory_allocated(self.device),
                    "peak_memory_source": f"torch.{self.device.type}.max_memory_allocated (weights, KV cache, "
                                          "activations)"}
        return {"peak_memory_bytes": self.peak or None,
                "peak_memory_source": "process RSS sampled while serving (a CPU has no allocator high-water mark)"}


def _loop_error(manager) -> Exception:
    """Why transformers' generation loop stopped: its fatal error when it recorded one."""
    error = manager.background_thread_status.fatal_error
    return error if isinstance(error, Exception) else RuntimeError("the continuous batching loop stopped")


def _drive(manager, requests: list[Request], in_flight: int | None, deadline: float,
           on_poll=None) -> list[RequestRecord]:
    """Send ``requests`` as their arrival times and the in-flight limit allow, and collect each one's timestamps.

    transformers records a ``time.perf_counter()`` timestamp per generated token on its generation thread
    (``record_timestamps=True``, ``RequestState.update_and_check_completion``) and the request's creation time in
    ``created_time`` when ``add_request`` queues it: that is the send time, on the same clock.
    """
    pending = deque(requests)
    prompt_tokens: dict[str, int] = {}
    outputs = {}
    started, active = time.perf_counter(), 0
    while len(outputs) < len(requests):
        now = time.perf_counter()
        while pending and (in_flight is None or active < in_flight) and started + pending[0].arrival_s <= now:
            request = pending.popleft()
            request_id = manager.add_request(request.prompt_ids, max_new_tokens=request.output_tokens,
                                             record_timestamps=True)
            if request_id is None:
                raise _loop_error(manager)
            prompt_tokens[request_id] = len(request.prompt_ids)
            active += 1
        wait = POLL_SECONDS
        if pending and (in_flight is None or active < in_flight):
            wait = min(wait, max(0.0, started + pending[0].arrival_s - now))
        output = manager.get_result(timeout=wait)
        if on_poll is not None:
            on_poll()
        if output is not None and output.error is not None:
            # One failed request fails the configuration (an out-of-memory error says so in its message).
            raise RuntimeError(f"request {output.request_id} failed: {output.error}")
        if output is not None and output.is_finished():
            outputs[output.request_id] = output
            active -= 1
        elif output is None and not manager.is_running():
            raise _loop_error(manager)
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{len(outputs)} of {len(requests)} requests done when the trial's time ran out")
    return [RequestRecord(send_time=output.created_time, token_times=list(output.timestamps or []),
                          prompt_tokens=prompt_tokens[request_id])
            for request_id, output in outputs.items()]


class TransformersContinuousBatching(BenchmarkBackend):
    """transformers' continuous batching (the engine behind ``model.generate_batch``: a ``ContinuousBatchingManager``
    with a paged KV cache of ``num_blocks`` blocks of ``page_size`` tokens), driven request by request so that
    closed-loop and Poisson arrivals both work. One model is kept at a time (the current precision's)."""

    name = "transformers"

    def __init__(self, config: dict, *, device: torch.device, reduce: bool = True, seed: int = 0):
        self.device = device
        self.seed = seed
        self.model_config, self.model_description = benchmark_config(config, reduce=reduce)
        self.vocab_size = causal_lm_config(load_config(self.model_config)).vocab_size
        self._loaded: tuple[str, object, ModelCost] | None = None
        self.paged_cache_error: str | None = None  # set once continuous batching failed on this architecture

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            from transformers import ContinuousBatchingConfig  # noqa: F401
        except ImportError as error:
            return f"this transformers has no continuous batching: {error}"
        return None

    def unsupported_reason(self, params: TrialParams) -> str | None:
        if params.precision not in SERVED_DTYPES:
            return f"unknown precision {params.precision!r}; known: {', '.join(SERVED_DTYPES)}"
        if params.precision == "int8":
            return dynamic_int8_unsupported(self.device)
        return None

    def describe(self) -> dict:
        import transformers

        return {**super().describe(), "engine": "transformers ContinuousBatchingManager, paged KV cache",
                "transformers_version": transformers.__version__, "device": str(self.device),
                "model": self.model_description}

    def _release(self) -> None:
        self._loaded = None
        gc.collect()
        if self.device.type != "cpu" and hasattr(module := torch.get_device_module(self.device.type), "empty_cache"):
            module.empty_cache()

    def _model(self, precision: str):
        if self._loaded is None or self._loaded[0] != precision:
            self._release()
            model = build_random_model(load_config(self.model_config), dtype=SERVED_DTYPES[precision],
                                       device=self.device, seed=self.seed)
            if precision == "int8":
                # Costed before quantisation: linear weights become 1 byte, everything else stays fp32.
                cost = model_cost(model, lambda module, parameter: 1 if isinstance(module, torch.nn.Linear)
                                  and parameter is module.weight else parameter.element_size(), activation_bytes=4)
                model = quantize_dynamic_int8(model)
            else:
                cost = model_cost(model, lambda module, parameter: parameter.element_size(),
                                  activation_bytes=model.dtype.itemsize)
            self._loaded = (precision, model, cost)
        return self._loaded[1], self._loaded[2]

    def pages(self, configs: list[TrialParams]) -> bool:
        """Whether the paged cache serves this architecture, found by serving one request of two tokens through it
        with the first configuration this backend supports (at once, so that a sweep knows before its search
        whether page_size and max_batch_tokens are knobs at all). An error the probe cannot pin on the paged
        cache (the model does not build, out of memory) leaves it undecided: True, and the trials say what failed."""
        if self.paged_cache_error is not None:
            return False
        params = next((params for params in configs if self.unsupported_reason(params) is None), None)
        if params is None:
            return True
        # One warm-up request too: the serving loop reads the manager's state, which exists once it has served.
        probe = Workload.from_dict({"requests": 1, "prompt_len": 4, "output_len": 2, "warmup_requests": 1})
        try:
            model, cost = self._model(params.precision)
        except Exception:
            return True
        try:
            self._serve(model, cost, Trial(params, probe))
        except Exception as error:
            if is_out_of_memory(error):
                self._release()
                return True
            self.paged_cache_error = _describe_error(error)
            return False
        return True

    def run(self, trial: Trial) -> TrialResult:
        params = trial.params
        if reason := self.unsupported_reason(params):
            return TrialResult(params, "unsupported", reason)
        try:
            model, cost = self._model(params.precision)
            if self.paged_cache_error is None:
                try:
                    return self._serve(model, cost, trial)
                except Exception as error:
                    if is_out_of_memory(error):
                        raise
                    # The paged cache cannot hold this architecture's attention state (MLA's latent, Mamba and
                    # linear-attention state, an indexer): every later trial is served by static batches instead.
                    self.paged_cache_error = _describe_error(error)
            return _serve_static(model, cost, trial, self.device, self.vocab_size, self.paged_cache_error)
        except Exception as error:  # a failed configuration is a result of the sweep, not the end of it
            if is_out_of_memory(error):
                self._release()
                return TrialResult(params, "oom", _describe_error(error))
            return TrialResult(params, "failed", _describe_error(error))

    def _serve(self, model, cost: ModelCost, trial: Trial) -> TrialResult:
        from transformers import ContinuousBatchingConfig, GenerationConfig
        from transformers.generation.continuous_batching.utils import WorkloadHints

        params, workload = trial.params, trial.workload
        in_flight = workload.in_flight_limit(params.batch_size)
        measured = workload.measured_requests(self.vocab_size)
        warmup = workload.warmup(self.vocab_size, params.batch_size)
        # The cache holds every request that can be in flight at its longest, so the sweep measures the page size
        # and batch shape, not evictions (an auto-sized cache would also take 60% of a CPU node's RAM).
        slots = max(params.batch_size, in_flight or 0)
        blocks = slots * (math.ceil(workload.max_sequence_tokens() / params.page_size) + 1)
        cb_config = ContinuousBatchingConfig(page_size=params.page_size, num_blocks=blocks,
                                             max_batch_tokens=params.max_batch_tokens,
                                             max_requests_per_batch=params.batch_size, seed=self.seed)
        # No EOS: every request generates exactly its output length, as vLLM's benchmark does with --ignore-eos.
        generation = GenerationConfig(do_sample=False, eos_token_id=-1,
                                      max_new_tokens=max(request.output_tokens for request in measured))
        hints = WorkloadHints(max_prompt_length=max(len(request.prompt_ids) for request in measured),
                              max_generated_length=generation.max_new_tokens, num_requests=len(measured))
        memory = PeakMemory(self.device)
        deadline = time.perf_counter() + workload.timeout_s
        with model.continuous_batching_context_manager(generation_config=generation, workload_hints=hints,
                                                       continuous_batching_config=cb_config) as manager:
            try:
                _drive(manager, warmup, None, deadline)
                memory.reset()
                steps_before = manager.current_batch
                records = _drive(manager, measured, in_flight, deadline, memory.sample)
            except BaseException:
                # Without this the context manager's exit would wait for every queued request to finish.
                manager.stop(block=True, hard_stop=True)
                raise
            resolved = manager.continuous_batching_config
            details = {"attention": model.config._attn_implementation, "num_blocks": resolved.num_blocks,
                       "max_batch_tokens": resolved.max_batch_tokens,
                       "max_requests_per_batch": resolved.max_requests_per_batch,
                       "generation_steps": manager.current_batch - steps_before, "warmup_requests": len(warmup),
                       "in_flight_limit": in_flight}
            kv_cache_bytes = manager.batch_processor.cache.cache_tensor.numel()
        memory_figures = {**memory.result(), "kv_cache_bytes": kv_cache_bytes,
                          "weight_bytes": cost.dense_weight_bytes + cost.expert_weight_bytes}
        return TrialResult(params, "ok", None, records, cost, memory_figures, details)


STATIC_PATH = ("static batches: the model's own cache (no paging), each wave of batch_size requests prefilled "
               "together and decoded to its longest output; page_size and max_batch_tokens are not knobs here")


def _serve_static(model, cost: ModelCost, trial: Trial, device: torch.device, vocab_size: int,
                  paged_cache_error: str) -> TrialResult:
    """Serve the trial's requests in waves of at most ``batch_size`` with the model's own forward and cache, the
    way ``generate`` does, timing every token. A wave starts once its requests have arrived (Poisson arrivals wait
    for their wave: their TTFT includes that wait) and runs until its longest output is done."""
    params, workload = trial.params, trial.workload
    wave_size = min(params.batch_size, workload.in_flight_limit(params.batch_size) or params.batch_size)
    measured = workload.measured_requests(vocab_size)
    warmup = workload.warmup(vocab_size, params.batch_size)
    memory = PeakMemory(device)
    deadline = time.perf_counter() + workload.timeout_s
    _static_waves(model, warmup, wave_size, device, deadline, None)
    memory.reset()
    records = _static_waves(model, measured, wave_size, device, deadline, memory.sample)
    details = {"serving_path": STATIC_PATH, "paged_cache_error": paged_cache_error,
               "attention": model.config._attn_implementation, "wave_size": wave_size,
               "warmup_requests": len(warmup),
               # One forward per token of a wave's longest output (the first one is the prefill).
               "generation_steps": sum(max(request.output_tokens for request in measured[first:first + wave_size])
                                       for first in range(0, len(measured), wave_size))}
    memory_figures = {**memory.result(), "kv_cache_bytes": None,
                      "weight_bytes": cost.dense_weight_bytes + cost.expert_weight_bytes}
    return TrialResult(params, "ok", None, records, cost, memory_figures, details)


def _static_waves(model, requests: list[Request], wave_size: int, device: torch.device, deadline: float,
                  on_step) -> list[RequestRecord]:
    records = []
    started = time.perf_counter()
    for first in range(0, len(requests), wave_size):
        wave = requests[first:first + wave_size]
        # A wave goes once its last request has arrived; each request's send time is its own arrival.
        arrivals = [started + request.arrival_s for request in wave]
        while time.perf_counter() < max(arrivals):
            time.sleep(min(POLL_SECONDS, max(arrivals) - time.perf_counter()))
        send_times = [max(arrival, started) for arrival in arrivals]
        token_times = _decode_wave(model, wave, device, deadline, on_step)
        records += [RequestRecord(send_time=sent, token_times=times, prompt_tokens=len(request.prompt_ids))
                    for sent, times, request in zip(send_times, token_times, wave, strict=True)]
    return records


def _decode_wave(model, wave: list[Request], device: torch.device, deadline: float, on_step) -> list[list[float]]:
    """Greedy decoding of one wave (left-padded prompts, the model's own cache); per request, when each of its
    output tokens came out."""
    longest = max(len(request.prompt_ids) for request in wave)
    ids = torch.zeros((len(wave), longest), dtype=torch.long)
    mask = torch.zeros((len(wave), longest), dtype=torch.long)
    for row, request in enumerate(wave):
        ids[row, longest - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
        mask[row, longest - len(request.prompt_ids):] = 1
    ids, mask = ids.to(device), mask.to(device)
    times: list[list[float]] = [[] for _ in wave]
    cache = None
    with torch.inference_mode():
        for step in range(max(request.output_tokens for request in wave)):
            output = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            cache = output.cache
            ids = output.logits[:, -1:].argmax(-1)
            if device.type != "cpu":
                torch.get_device_module(device.type).synchronize(device)
            now = time.perf_counter()
            for row, request in enumerate(wave):
                if step < request.output_tokens:
                    times[row].append(now)
            mask = torch.cat([mask, torch.ones((len(wave), 1), dtype=mask.dtype, device=device)], dim=1)
            if on_step is not None:
                on_step()
            if now > deadline:
                raise TimeoutError("the trial's time ran out in the middle of a wave")
    return times


# Keyed by the names the sweep's parameters accept (``sweep.PROXY_BACKENDS``, declared without torch).
BACKENDS: dict[str, type[BenchmarkBackend]] = {
    "transformers": TransformersContinuousBatching,
}
