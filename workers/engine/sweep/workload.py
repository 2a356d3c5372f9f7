"""The requests a trial sends: prompt and output lengths, how they arrive, the warm-up, and the SLOs for goodput.

A length is a fixed ``32``, a uniform range ``{"uniform": [16, 64]}`` (both ends included), a normal distribution
``{"normal": [mean, stddev]}`` (rounded, cut to 1 .. mean + 3 stddev, so the longest sequence is known before any
request is made) or a list of lengths used in turn ``[16, 32, 48]``. Arrivals are either a closed loop
(``"arrival": "closed"``: ``concurrency`` requests in flight, a new one sent as soon as one finishes; the concurrency
defaults to the trial's batch size) or a Poisson process (``"arrival": "poisson"`` at ``rate`` requests/s,
exponential gaps between sends, as vLLM's ``benchmark_serving --request-rate`` does with burstiness 1;
``concurrency`` then caps requests in flight).
Prompts are random token ids from a seeded generator, so every trial of a sweep sends the same requests.

A prompts file (``read_prompts_file``: JSON lines ``{"prompt_len": 812, "output_len": 130}``, a trace of a team's
traffic) becomes the two lists, its lines used in turn; the stage's ``prompts_file`` parameter names it, under the
node's data roots.

SLOs (``slo``) are per request in seconds (``ttft_s``, ``tpot_s``, ``e2e_latency_s``: vLLM's ``--goodput``) or on a
run's percentile in milliseconds (``ttft_p95_ms``, ``ttft_p99_ms``, ``tpot_p95_ms``...; ``metrics``).
``goodput_search``: ``"rate"`` (Poisson arrivals, ``rate`` the first rate tried) or ``"concurrency"`` (a closed loop,
``concurrency`` the first tried) makes each engine configuration's trial a search for the highest load that meets the
SLOs (``serving.goodput``), at most ``goodput_runs`` runs of ``requests`` requests each.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field, replace

from ..parameters import ParameterError
from .metrics import PERCENTILE_SLO_KEYS, REQUEST_SLO_KEYS

# Upper bounds, so a job cannot make a node run out of memory or flood an endpoint; a job past one is refused at
# submit (a 400 naming the key). Each is far above what a benchmark of a serving configuration needs.
MAX_REQUESTS = 100_000
MAX_PROMPT_LEN = 1 << 20  # 1,048,576 tokens: the longest context windows open models offer (Qwen2.5-1M)
MAX_OUTPUT_LEN = 1 << 17  # 131,072 tokens: the longest generation budgets engines take (reasoning models)
MAX_IN_FLIGHT = 4096  # concurrency and warm-up requests (the warm-up is sent all at once)
# requests x longest sequence: prompts are made up front, as Python lists of token ids (about 36 bytes a token), so
# this keeps a workload's own requests under ~600 MB; 1000 requests of 1k + 1k tokens take 2M.
MAX_TOKENS = 1 << 24
MAX_RATE = 100_000.0  # requests/s of a Poisson arrival
MAX_SECONDS = 86_400.0  # a trial's timeout and an SLO
LIMITS = {"requests": MAX_REQUESTS, "prompt_len": MAX_PROMPT_LEN, "output_len": MAX_OUTPUT_LEN,
          "concurrency": MAX_IN_FLIGHT, "warmup_requests": MAX_IN_FLIGHT, "rate": MAX_RATE,
          "timeout_s": MAX_SECONDS, "tokens": MAX_TOKENS}
# For the parameters' help (the job form and the API schema show it).
WORKLOAD_BOUNDS = (f"requests at most {MAX_REQUESTS}, prompt_len {MAX_PROMPT_LEN}, output_len {MAX_OUTPUT_LEN}, "
                   f"concurrency and warmup_requests {MAX_IN_FLIGHT}, requests x (prompt_len + output_len) "
                   f"{MAX_TOKENS} tokens")

ARRIVALS = ("closed", "poisson")
SLO_KEYS = REQUEST_SLO_KEYS + PERCENTILE_SLO_KEYS
GOODPUT_SEARCHES = ("rate", "concurrency")
MAX_GOODPUT_RUNS = 32
# Each side of a normal length's mean, in standard deviations, that a sampled length may fall.
NORMAL_CUT = 3
# Warm-up prompts come from another stream than the measured ones, so the paged cache's prefix sharing cannot serve
# a measured prompt from a warm-up's blocks.
WARMUP_SEED_OFFSET = 1_000_003
WARMUP_OUTPUT_TOKENS = 2


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    output_tokens: int
    # Seconds after the start of the measured run at which the request may be sent (0 in a closed loop).
    arrival_s: float = 0.0


def _check_length(spec, name: str) -> None:
    def positive(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    if positive(spec):
        return
    if isinstance(spec, list) and spec and all(positive(value) for value in spec):
        return
    if isinstance(spec, dict) and set(spec) == {"uniform"}:
        bounds = spec["uniform"]
        if isinstance(bounds, list) and len(bounds) == 2 and all(map(positive, bounds)) and bounds[0] <= bounds[1]:
            return
    if isinstance(spec, dict) and set(spec) == {"normal"}:
        shape = spec["normal"]
        if (isinstance(shape, list) and len(shape) == 2 and all(isinstance(value, int | float)
                                                                 and not isinstance(value, bool) for value in shape)
                and math.isfinite(shape[0]) and math.isfinite(shape[1]) and shape[0] >= 1 and shape[1] >= 0):
            return
    raise ValueError(f"{name} must be a positive int, a non-empty list of them, {{'uniform': [low, high]}} or "
                     f"{{'normal': [mean >= 1, stddev >= 0]}}, not {spec!r}")


def sample_lengths(spec, count: int, rng: random.Random) -> list[int]:
    if isinstance(spec, int):
        return [spec] * count
    if isinstance(spec, list):
        return [spec[index % len(spec)] for index in range(count)]
    if "normal" in spec:
        mean, stddev = spec["normal"]
        return [min(max(1, round(rng.gauss(mean, stddev))), largest_length(spec)) for _ in range(count)]
    low, high = spec["uniform"]
    return [rng.randint(low, high) for _ in range(count)]


def largest_length(spec) -> int:
    if isinstance(spec, int):
        return spec
    if isinstance(spec, list):
        return max(spec)
    if "normal" in spec:
        mean, stddev = spec["normal"]
        return max(1, math.floor(mean + NORMAL_CUT * stddev))
    return spec["uniform"][1]


@dataclass(frozen=True)
class Workload:
    requests: int = 16
    prompt_len: int | list | dict = 32
    output_len: int | list | dict = 16
    arrival: str = "closed"
    rate: float | None = None
    concurrency: int | None = None
    # None: one warm-up request per in-flight slot, so the first full batch is warmed up too.
    warmup_requests: int | None = None
    seed: int = 0
    slo: dict = field(default_factory=dict)
    # A trial still running after this long is stopped and recorded as failed rather than holding the node.
    timeout_s: float = 600.0
    goodput_search: str | None = None
    goodput_runs: int = 8

    @classmethod
    def from_dict(cls, data: dict | None) -> Workload:
        data = dict(data or {})
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown workload keys: {', '.join(sorted(unknown))}")
        workload = cls(**data)
        workload.validate()
        return workload

    def validate(self) -> None:
        if not isinstance(self.requests, int) or self.requests < 1:
            raise ValueError(f"requests must be a positive int, not {self.requests!r}")
        _check_length(self.prompt_len, "prompt_len")
        _check_length(self.output_len, "output_len")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, not {self.arrival!r}")
        if self.arrival == "poisson" and not (isinstance(self.rate, int | float) and self.rate > 0):
            raise ValueError("a Poisson arrival needs a positive rate (requests/s)")
        if self.arrival == "closed" and self.rate is not None:
            raise ValueError("rate applies to Poisson arrivals only; a closed loop is paced by its concurrency")
        for name in ("concurrency", "warmup_requests"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < (1 if name == "concurrency" else 0)):
                raise ValueError(f"{name} must be a {'positive' if name == 'concurrency' else 'non-negative'} int")
        if not isinstance(self.slo, dict):
            raise ValueError(f"slo must be an object, not {self.slo!r}")
        unknown_slo = set(self.slo) - set(SLO_KEYS)
        if unknown_slo or not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                                  for v in self.slo.values()):
            raise ValueError(f"slo takes positive seconds for {', '.join(REQUEST_SLO_KEYS)} or positive "
                             f"milliseconds for a run's percentile (ttft_p95_ms, ttft_p99_ms, tpot_p95_ms: "
                             f"<ttft|tpot|itl|e2e_latency>_p<50|90|95|99>_ms), not {self.slo!r}")
        self._check_goodput_search()
        if not isinstance(self.timeout_s, int | float) or isinstance(self.timeout_s, bool) or self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive seconds, not {self.timeout_s!r}")
        self._check_bounds()

    def _check_goodput_search(self) -> None:
        if self.goodput_search is None:
            return
        if self.goodput_search not in GOODPUT_SEARCHES:
            raise ValueError(f"goodput_search must be one of {', '.join(GOODPUT_SEARCHES)}, "
                             f"not {self.goodput_search!r}")
        if not self.slo:
            raise ValueError("goodput_search needs SLOs to meet (slo: {'ttft_p95_ms': ..., 'tpot_p95_ms': ...})")
        needed = "poisson" if self.goodput_search == "rate" else "closed"
        if self.arrival != needed:
            raise ValueError(f"a {self.goodput_search} goodput search sends {needed} arrivals (arrival: {needed!r}), "
                             f"starting at the workload's {'rate' if needed == 'poisson' else 'concurrency'}")
        runs = self.goodput_runs
        if not isinstance(runs, int) or isinstance(runs, bool) or not 2 <= runs <= MAX_GOODPUT_RUNS:
            raise ParameterError("goodput_runs", f"must be an int from 2 to {MAX_GOODPUT_RUNS}, not {runs!r}")

    def _check_bounds(self) -> None:
        """The upper bounds (``LIMITS``), each refused naming its key."""
        given = {"requests": self.requests, "prompt_len": largest_length(self.prompt_len),
                 "output_len": largest_length(self.output_len), "concurrency": self.concurrency,
                 "warmup_requests": self.warmup_requests, "rate": self.rate, "timeout_s": self.timeout_s,
                 **{f"slo.{key}": value for key, value in self.slo.items()}}
        for key, value in given.items():
            limit = LIMITS.get(key, MAX_SECONDS)
            if value is not None and value > limit:
                raise ParameterError(key, f"must be at most {limit:n}, not {value:n}")
        for key in ("prompt_len", "output_len"):
            spec = getattr(self, key)
            if isinstance(spec, list) and len(spec) > MAX_IN_FLIGHT:
                raise ParameterError(key, f"takes at most {MAX_IN_FLIGHT} lengths, not {len(spec)}")
        tokens = self.requests * self.max_sequence_tokens()
        if tokens > MAX_TOKENS:
            raise ParameterError("requests", f"{self.requests} requests of up to {self.max_sequence_tokens()} tokens "
                                             f"(prompt + output) make {tokens} tokens; at most {MAX_TOKENS}")

    def as_dict(self) -> dict:
        return asdict(self)

    def in_flight_limit(self, batch_size: int) -> int | None:
        """Requests in flight at most: the closed loop's concurrency (default the batch size), or a Poisson cap."""
        if self.arrival == "closed":
            return self.concurrency or batch_size
        return self.concurrency

    def max_sequence_tokens(self) -> int:
        return largest_length(self.prompt_len) + largest_length(self.output_len)

    def scaled(self, fraction: float, min_requests: int) -> Workload:
        """The same workload with ``fraction`` of the requests, but never fewer than ``min_requests`` (e.g. one
        full batch, or a short run would judge a large batch size by a batch it never fills)."""
        requests = max(min_requests, math.ceil(self.requests * fraction))
        return replace(self, requests=min(self.requests, requests))

    def _requests(self, count: int, vocab_size: int, seed: int, output_len, arrival: bool) -> list[Request]:
        rng = random.Random(seed)
        prompt_lengths = sample_lengths(self.prompt_len, count, rng)
        output_lengths = sample_lengths(output_len, count, rng)
        arrivals, clock = [], 0.0
        for _ in range(count):
            arrivals.append(clock if arrival and self.arrival == "poisson" else 0.0)
            if self.arrival == "poisson":
                clock += rng.expovariate(self.rate)
        return [Request([rng.randrange(vocab_size) for _ in range(prompt)], output, at)
                for prompt, output, at in zip(prompt_lengths, output_lengths, arrivals, strict=True)]

    def measured_requests(self, vocab_size: int) -> list[Request]:
        return self._requests(self.requests, vocab_size, self.seed, self.output_len, arrival=True)

    def warmup(self, vocab_size: int, batch_size: int) -> list[Request]:
        """Warm-up requests, sent all at once and excluded from every figure: they pay for lazy initialisation,
        allocator growth and kernel selection, which the first measured requests would otherwise be charged for."""
        count = self.warmup_requests if self.warmup_requests is not None else (
            self.in_flight_limit(batch_size) or batch_size)
        return self._requests(count, vocab_size, self.seed + WARMUP_SEED_OFFSET, WARMUP_OUTPUT_TOKENS, arrival=False)


# A prompts file's size at most: its lines become lists of at most MAX_IN_FLIGHT lengths (``_check_bounds``).
MAX_PROMPTS_FILE_BYTES = 1 << 20


def read_prompts_file(path: str) -> dict:
    """A prompts file as a workload's ``prompt_len`` and ``output_len`` lists (line i: request i's lengths, then
    again from the first line). ``path`` is checked against the node's data roots before (a ``path`` parameter)."""
    with open(path, "rb") as handle:
        raw = handle.read(MAX_PROMPTS_FILE_BYTES + 1)
    if len(raw) > MAX_PROMPTS_FILE_BYTES:
        raise ParameterError("prompts_file", f"is over {MAX_PROMPTS_FILE_BYTES} bytes")
    prompt_lens, output_lens = [], []
    for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            raise ParameterError("prompts_file", f"line {number} is not JSON") from None
        if not isinstance(entry, dict) or not all(
                isinstance(entry.get(key), int) and not isinstance(entry.get(key), bool) and entry[key] >= 1
                for key in ("prompt_len", "output_len")):
            raise ParameterError("prompts_file", f"line {number} needs positive ints prompt_len and output_len")
        prompt_lens.append(entry["prompt_len"])
        output_lens.append(entry["output_len"])
    if not prompt_lens:
        raise ParameterError("prompts_file", "holds no prompts")
    return {"prompt_len": prompt_lens, "output_len": output_lens}
