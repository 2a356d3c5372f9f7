"""A continuous-batching engine simulated in virtual time: what the goodput search is tested and benchmarked against
where no engine runs (``benchmarks/goodput_search.py``, ``tests/engine/test_goodput.py``).

It serves a workload's requests (``Workload.measured_requests``: Poisson arrival times, or a closed loop's
``in_flight`` cap) as vLLM's scheduler does in outline: sent requests queue, each step admits queued requests up to
``max_num_seqs`` and decodes one token of every running request whose prompt is in the cache; prompts are prefilled
in chunks, at most ``max_num_batched_tokens`` tokens a step counting the decodes (vLLM's chunked prefill; None: no
limit), and a request's first token comes with the step that finishes its prompt. A step costs ``step_s`` plus
``token_s`` per decoded token plus ``prefill_token_s`` per prompt token. So TTFT grows with the queue once the
arrival rate passes the engine's capacity, TPOT grows with the batch and with the prefills that share its steps
(a larger token budget: shorter TTFT, longer TPOT). Each run draws one factor for the whole
run and one per step (lognormal, ``noise`` and ``noise / 2``), as a shared machine's slow spells and jitter.
It returns ``RequestRecord``s, so ``metrics.summarize`` reads it as it reads a real run.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

from ..sweep.metrics import RequestRecord
from ..sweep.workload import Request


@dataclass(frozen=True)
class SimulatedEngine:
    max_num_seqs: int
    step_s: float
    token_s: float
    prefill_token_s: float
    noise: float = 0.0
    max_num_batched_tokens: int | None = None

    def serve(self, requests: list[Request], in_flight: int | None = None, seed: int = 0) -> list[RequestRecord]:
        rng = random.Random(seed)
        run_factor = math.exp(rng.gauss(0, self.noise)) if self.noise else 1.0
        cap = in_flight or math.inf
        pending = deque(sorted(range(len(requests)), key=lambda index: requests[index].arrival_s))
        sent: dict[int, float] = {}
        tokens: dict[int, list[float]] = {index: [] for index in range(len(requests))}
        queue: deque[int] = deque()
        running: list[int] = []
        prompt_left: dict[int, int] = {}
        clock, finished = 0.0, 0

        def send_arrived(until: float, earliest: float) -> None:
            # The client sends a request at its arrival time, or when a slot of its cap frees (a step's end).
            while pending and requests[pending[0]].arrival_s <= until and len(sent) - finished < cap:
                index = pending.popleft()
                sent[index] = max(requests[index].arrival_s, earliest)
                queue.append(index)

        while pending or queue or running:
            if not queue and not running:
                clock = max(clock, requests[pending[0]].arrival_s)
            send_arrived(clock, clock)
            while queue and len(running) < self.max_num_seqs:
                index = queue.popleft()
                prompt_left[index] = len(requests[index].prompt_ids)
                running.append(index)
            decoding = [index for index in running if not prompt_left[index]]
            budget = (self.max_num_batched_tokens or math.inf) - len(decoding)
            emitting, prefilled = list(decoding), 0
            for index in running:
                if prompt_left[index] and budget > 0:
                    chunk = min(prompt_left[index], budget)
                    prompt_left[index] -= chunk
                    budget -= chunk
                    prefilled += chunk
                    if not prompt_left[index]:
                        emitting.append(index)
            step = self.step_s + self.token_s * len(decoding) + self.prefill_token_s * prefilled
            jitter = math.exp(rng.gauss(0, self.noise / 2)) if self.noise else 1.0
            end = clock + step * run_factor * jitter
            # Requests arriving during the step are sent then, and wait for the next step to be admitted.
            send_arrived(end, clock)
            for index in emitting:
                tokens[index].append(end)
            done = {index for index in running if len(tokens[index]) >= requests[index].output_tokens}
            finished += len(done)
            running = [index for index in running if index not in done]
            clock = end
        return [RequestRecord(sent[index], tokens[index], len(requests[index].prompt_ids))
                for index in range(len(requests))]
