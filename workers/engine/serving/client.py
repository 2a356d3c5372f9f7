"""d0's load client: a workload (``sweep.workload``) sent to an OpenAI-compatible server's streaming completions
API with aiohttp, one ``RequestRecord`` per request (send time, when each chunk came, the server's token count),
so the serving metrics are computed exactly as for every other backend (``sweep.metrics``, vLLM's definitions).

Prompts are token ids, so lengths are exact whatever the tokenizer; ``ignore_eos`` makes every request generate
its full output length (vLLM's ``--ignore-eos``). Closed loop: at most ``in_flight`` requests outstanding;
Poisson: each request waits for its arrival time, then for a free slot when ``in_flight`` caps it. Warm-up
requests go first and are excluded. A failed request is recorded with its error, never dropped.

What a reply says never reaches a result: an HTTP error is its status and its body's size, a redirect is such an
error (never followed), and a reply that is not HTTP is named by its error's type. An endpoint someone else runs
is reached at the addresses its check pinned (``endpoint_guard``), never by resolving its host again.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass

from ..sweep.metrics import RequestRecord
from ..sweep.workload import Request


@dataclass(frozen=True)
class Endpoint:
    """Where to send: the server's base URL (``http://host:port``, no ``/v1``), the model name it serves, and an
    API key when it wants one (sent as a bearer token, never logged)."""

    base_url: str
    model: str
    api_key: str | None = None
    ignore_eos: bool = True
    # The addresses its host was checked at (endpoint_guard.EndpointPolicy.pin): when given, every connection goes
    # to one of these. Empty for a server d0 started itself on this node.
    addresses: tuple[str, ...] = ()

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    @property
    def completions_url(self) -> str:
        return self.base_url.rstrip("/") + "/v1/completions"


class PinnedResolver:
    """aiohttp's resolver for a session that talks to one checked endpoint: any host name it is asked for is
    answered with the checked addresses, so no connection of the session reaches another address (an IP literal
    host is not resolved by aiohttp at all: it is the address that was checked)."""

    def __init__(self, addresses: tuple[str, ...]):
        self.addresses = addresses

    async def resolve(self, host: str, port: int = 0, family=socket.AF_UNSPEC) -> list[dict]:
        return [{"hostname": host, "host": address, "port": port,
                 "family": socket.AF_INET6 if ":" in address else socket.AF_INET, "proto": 0,
                 "flags": socket.AI_NUMERICHOST} for address in self.addresses]

    async def close(self) -> None:
        pass


def _connector(endpoint: Endpoint):
    import aiohttp

    resolver = PinnedResolver(endpoint.addresses) if endpoint.addresses else None
    return aiohttp.TCPConnector(limit=0, resolver=resolver)


# Bytes of an error reply counted for its size; past this the size is "more than" it (and the rest is not read).
ERROR_BODY_COUNTED = 1 << 20


async def http_error(response) -> str:
    """An HTTP error as its status and its body's size: the body may be anything the address serves (an internal
    service's page, a metadata document) and a job's error is read by every member of its team."""
    size = 0
    while size <= ERROR_BODY_COUNTED:
        chunk = await response.content.read(65536)
        if not chunk:
            break
        size += len(chunk)
    shown = f"{size} bytes" if size <= ERROR_BODY_COUNTED else f"over {ERROR_BODY_COUNTED} bytes"
    redirect = ", a redirect, not followed" if 300 <= response.status < 400 else ""
    return f"HTTP {response.status}{redirect} ({shown} of body, not shown)"


def failure(error: BaseException) -> str:
    """A request's exception as a record's error. aiohttp's errors about a reply quote it (a bad status line is a
    non-HTTP service's banner, a disconnect mid-reply carries its headers), so only a failure to connect keeps its
    message; any other error of the client is named by its type (and status)."""
    import aiohttp

    name = type(error).__name__
    if isinstance(error, aiohttp.ClientResponseError):
        return f"{name}: status {error.status} (the reply is not shown)"
    if isinstance(error, aiohttp.ClientError) and not isinstance(error, (aiohttp.ClientConnectorError,
                                                                         aiohttp.ClientOSError)):
        return f"{name} (the reply is not shown)"
    return f"{name}: {error}"[:300]


@dataclass
class ClientRun:
    records: list[RequestRecord]
    warmup_records: list[RequestRecord]
    # The client's own CPU time (this process, user + system) over the measured requests, per request.
    client_cpu_s_per_request: float
    wall_s: float


async def _stream_one(session, endpoint: Endpoint, request: Request) -> RequestRecord:
    payload = {"model": endpoint.model, "prompt": request.prompt_ids, "max_tokens": request.output_tokens,
               "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if endpoint.ignore_eos:
        payload["ignore_eos"] = True
    chunk_times: list[float] = []
    reported = None
    sent = time.perf_counter()
    try:
        async with session.post(endpoint.completions_url, json=payload, headers=endpoint.headers(),
                                allow_redirects=False) as response:
            if response.status != 200:
                return RequestRecord(sent, [], len(request.prompt_ids), error=await http_error(response))
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    chunk_times.append(now)
                if chunk.get("usage"):
                    reported = chunk["usage"].get("completion_tokens")
    except Exception as error:  # a failed request is a result: counted and shown, the run goes on
        return RequestRecord(sent, chunk_times, len(request.prompt_ids), error=failure(error))
    if reported is not None and reported != request.output_tokens and endpoint.ignore_eos:
        return RequestRecord(sent, chunk_times, len(request.prompt_ids), reported_output_tokens=reported,
                             error=f"asked for {request.output_tokens} tokens, the server generated {reported}")
    return RequestRecord(sent, chunk_times, len(request.prompt_ids), reported_output_tokens=reported)


async def _send_all(session, endpoint: Endpoint, requests: list[Request], in_flight: int | None) -> list:
    slots = asyncio.Semaphore(in_flight) if in_flight else None
    started = time.perf_counter()

    async def one(request: Request) -> RequestRecord:
        delay = started + request.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if slots is None:
            return await _stream_one(session, endpoint, request)
        async with slots:
            return await _stream_one(session, endpoint, request)

    return list(await asyncio.gather(*(one(request) for request in requests)))


async def _run(endpoint: Endpoint, measured: list[Request], warmup: list[Request], in_flight: int | None,
               timeout_s: float) -> ClientRun:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=_connector(endpoint)) as session:
        warmup_records = await _send_all(session, endpoint, warmup, None) if warmup else []
        cpu, wall = time.process_time(), time.perf_counter()
        records = await _send_all(session, endpoint, measured, in_flight)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return ClientRun(records, warmup_records, cpu / max(1, len(measured)), wall)


def run_requests(endpoint: Endpoint, measured: list[Request], *, warmup: list[Request] = (),
                 in_flight: int | None = None, timeout_s: float = 600.0) -> ClientRun:
    """Send the warm-up, then the measured requests; every request's record (failed ones with their error)."""
    try:
        return asyncio.run(asyncio.wait_for(_run(endpoint, measured, list(warmup), in_flight, timeout_s),
                                            timeout_s))
    except TimeoutError:
        raise TimeoutError(f"the requests were not all answered within {timeout_s:.0f} s") from None


def greedy(endpoint: Endpoint, prompts: list[list[int]], max_tokens: int, *, timeout_s: float = 300.0,
           logprobs: bool = True) -> list[dict]:
    """Greedy completions (not streamed) with the tokens' ids and logprobs: ``[{"token_ids", "logprobs"}]``."""
    import aiohttp

    async def fetch() -> list[dict]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                         connector=_connector(endpoint)) as session:
            async def one(prompt):
                payload = {"model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
                           **({"logprobs": 1} if logprobs else {})}
                async with session.post(endpoint.completions_url, json=payload, headers=endpoint.headers(),
                                        allow_redirects=False) as response:
                    if response.status != 200:
                        raise RuntimeError(await http_error(response))
                    body = await response.json(content_type=None)
                choice = body["choices"][0]
                found = (choice.get("logprobs") or {}).get("token_logprobs")
                return {"token_ids": choice.get("token_ids"), "logprobs": found}

            return [await one(prompt) for prompt in prompts]

    return asyncio.run(fetch())
