"""``serve_sweep``: the model served by a real engine (vLLM first) on this node, under a grid of engine settings,
benchmarked with d0's load client, checked for correctness, and the best configuration written as a recipe.

Each combination of the grid's engine settings is one engine start (its own process group, ``server``); a grid's
``concurrency`` values are client-side, so they reuse that start. ``search: "smart"`` runs successive halving
instead (``sweep.search``): every configuration (engine settings and concurrency, an engine start each) serves a
short workload first and only the best third go on, and a configuration at least as large as one that ran out of
memory is skipped. It saves serving time, not engine starts, so it pays where trials are long next to a start.
A configuration that cannot start (out of memory, unsupported, timed out) is a trial that failed with the cause
read from the engine's log, and the sweep goes on.
The weights are a node-local checkpoint (``weights_path``, under the node's data roots), its safetensors headers
checked against the config before any engine starts (``tensors``), or a validation checkpoint d0 writes
(``checkpoint``). The stage fails when no trial served its whole workload.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import workdirs
from ..parameters import ParameterError
from ..sweep.metrics import DEFINITIONS, summarize
from ..sweep.result import Goodput, Metrics, ServingBest, ServingTrial, TrialWorkload
from ..sweep.search import MAX_GRID_VALUES, SEARCHES, Space
from ..sweep.verdict import MIN_RUNS, judge, median_run
from ..sweep.workload import MAX_IN_FLIGHT, Workload, read_prompts_file
from ..models.demo import check_demo_config, make_demo_checkpoint
from .checkpoint import vocab_size, write_validation_checkpoint
from .client import Endpoint, run_requests
from .correctness import check_correctness
from .quality import (QualityCheck, ReferenceUnavailable, accuracy_settings, numerics_of, variant_summary,
                      variant_weights)
from .variants import AS_SHIPPED
from .deployment import DeployedServer, DeploymentFailed, Follower, Leader, Rendezvous, spans_nodes
from .engines import configured_engines
from .goodput import goodput_trial
from .launchers import LAUNCHERS, NodeRole, check_settings, layout_of, split_over_nodes
from .recipe import recipe
from .server import EngineFailed, EngineServer, free_port, stop_servers_on_sigterm
from .tensors import CheckpointRefused, check_checkpoint

CLIENT_KEYS = ("concurrency",)
# Block sizes every vLLM attention backend takes (the CPU build's wants multiples of 32; 16 is refused there).
DEFAULT_GRID = {"max_num_seqs": [2, 4], "block_size": [32, 64]}
MAX_CONFIGURATIONS = 64
# On vLLM's CPU build the "GPU" memory share is of RAM and its 0.92 default refuses to start beside other
# processes; the KV cache is sized by VLLM_CPU_KVCACHE_SPACE instead.
CPU_DEFAULTS = {"gpu_memory_utilization": 0.1, "kv_cache_space_gib": 1}
SAMPLE_S = 0.2
# The configurations judged (the winner and its runner-up), each served until it has MIN_RUNS runs.
FINALISTS = 2


def check_sweep_settings(settings: dict) -> dict:
    """Engine settings a sweep takes: ``launchers.check_settings``'s, less ``variant``, which the sweep sets itself
    from its ``variants`` (a variant named here would be served without being made)."""
    if isinstance(settings, dict) and "variant" in settings:
        raise ValueError("variant is not set by hand: name the variants to serve in the variants parameter")
    return check_settings(settings)


def check_grid(grid: dict) -> None:
    if not isinstance(grid, dict):
        raise ValueError("the grid maps engine settings (and concurrency) to lists of values")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid {key} must be a non-empty list")
        if len(values) > MAX_GRID_VALUES:
            raise ParameterError(key, f"takes at most {MAX_GRID_VALUES} values, not {len(values)}")
        if key in CLIENT_KEYS:
            if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 1 for value in values):
                raise ValueError("grid concurrency takes positive ints")
            if max(values) > MAX_IN_FLIGHT:
                raise ParameterError(key, f"values must be at most {MAX_IN_FLIGHT}, not {max(values)}")
            continue
        for value in values:
            check_sweep_settings({key: value})
    # The product of the lengths, not of the lists: a grid of many long lists is refused without being multiplied out.
    count = math.prod(len(values) for values in grid.values())
    if count > MAX_CONFIGURATIONS:
        raise ValueError(f"the grid has {count} configurations; at most {MAX_CONFIGURATIONS}")


class ServeSweepFailed(RuntimeError):
    pass


def engine_configurations(settings: dict, grid: dict) -> list[tuple[dict, list[dict]]]:
    """``[(engine settings, [client settings, ...])]``: one entry per engine start."""
    engine_keys = [key for key in grid if key not in CLIENT_KEYS]
    client_keys = [key for key in grid if key in CLIENT_KEYS]
    clients = [dict(zip(client_keys, values, strict=True))
               for values in itertools.product(*(grid[key] for key in client_keys))] or [{}]
    return [({**settings, **dict(zip(engine_keys, values, strict=True))}, clients)
            for values in itertools.product(*(grid[key] for key in engine_keys))]


@dataclass(frozen=True)
class EngineConfiguration:
    """One engine start's settings and the client settings it is served with (a smart search's unit)."""

    settings: dict
    client: dict


# Settings that, when larger (and everything else equal), need at least as much memory: more sequences, tokens or
# length per step, a larger KV cache, more requests in flight. gpu_memory_utilization is not among them: too low a
# share leaves the KV cache no room, which raising it cures.
GROWS_MEMORY = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_space_gib", "concurrency")


def engine_space(fill) -> Space:
    """The search's view of engine configurations; ``fill`` adds the defaults a start uses (as trials store)."""

    def at_least_as_large(config: EngineConfiguration, trial: dict) -> bool:
        ours, theirs = {**fill(config.settings), **config.client}, {**trial["settings"], **trial["client"]}
        for key in ours.keys() | theirs.keys():
            if key in GROWS_MEMORY and key in ours and key in theirs:
                if ours[key] < theirs[key]:
                    return False
            elif ours.get(key) != theirs.get(key):
                return False
        return True

    return Space(label=lambda config: ", ".join(f"{k}={v}" for k, v in {**config.settings, **config.client}.items())
                 or "the engine's defaults",
                 as_dict=lambda config: {"settings": config.settings, "client": config.client},
                 batch_size=lambda config: config.settings.get("max_num_seqs", 1),
                 out_of_memory=lambda trial: trial.get("cause") == "out of memory",
                 at_least_as_large=at_least_as_large,
                 skipped=lambda config, reason: ServingTrial(settings=fill(config.settings), client=config.client,
                                                             status="skipped", reason=reason).as_dict(),
                 # The finalists are served again by repeat_finalists, within one start each, not by the halving's
                 # confirmation runs (an engine start each).
                 confirm_finalists=False)


class _PeakRss(threading.Thread):
    """The engine's resident memory, all processes of its group, sampled while it serves."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stopped = pid, 0, threading.Event()

    def sample(self) -> None:
        import psutil

        try:
            leader = psutil.Process(self.pid)
            processes = [leader, *leader.children(recursive=True)]
            self.peak = max(self.peak, sum(_rss(process) for process in processes))
        except psutil.Error:
            pass

    def run(self) -> None:
        # A sample at once and one at the end too: a short trial may be over before the first interval.
        self.sample()
        while not self.stopped.wait(SAMPLE_S):
            self.sample()

    def finish(self) -> int | None:
        self.stopped.set()
        self.join(timeout=2)
        self.sample()
        return self.peak or None


def _rss(process) -> int:
    import psutil

    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


class Session:
    """One stage's engine, checkpoint and log folder; ``leader``: node rank 0's side of a deployment over several
    nodes (``deployment``), whose engine starts then span them all."""

    def __init__(self, engine, described: dict, checkpoint: Path, logs: Path, max_model_len: int,
                 leader: Leader | None = None):
        self.engine, self.described, self.checkpoint, self.logs = engine, described, checkpoint, logs
        self.max_model_len, self.leader = max_model_len, leader
        self.launcher = LAUNCHERS[engine.name]
        self.starts = 0
        # On real weights: each start's numerics checked against the release (``quality``); the variants served
        # (name -> its folder and the engine settings it needs), the checkpoint as shipped when none is named.
        self.quality: QualityCheck | None = None
        self.variants: dict[str, dict] = {}
        self.skipped_variants: dict[str, str] = {}  # name -> why this node cannot serve it
        # Read once: every trial's prompts and the correctness check draw token ids below it.
        self.vocab = vocab_size(json.loads((checkpoint / "config.json").read_text()))

    def settings(self, settings: dict) -> dict:
        filled = dict(settings)
        if self.described.get("cpu_build"):
            filled = {**CPU_DEFAULTS, **filled}
        filled.setdefault("max_model_len", self.max_model_len)
        return filled

    def served_checkpoint(self, settings: dict) -> Path:
        variant = self.variants.get(settings.get("variant", AS_SHIPPED))
        return Path(variant["path"]) if variant else self.checkpoint

    def server(self, settings: dict) -> tuple[EngineServer, object]:
        self.starts += 1
        port, filled = free_port(), self.settings(settings)
        variant = self.variants.get(filled.get("variant", AS_SHIPPED)) or {}
        checkpoint = Path(variant["path"]) if variant else self.checkpoint
        filled = {**variant.get("settings", {}), **filled}
        log_path = self.logs / f"engine-{self.starts}.log"
        cpu_build = bool(self.described.get("cpu_build"))
        if self.leader is not None and spans_nodes(filled):
            engine_port = free_port()
            launch = self.launcher.launch(self.engine.python, checkpoint, filled, port=port, cpu_build=cpu_build,
                                          role=self.leader.role(engine_port, node_address()))
            server = DeployedServer(launch.command, env=launch.env, port=port, health_path=launch.health_path,
                                    log_path=log_path, leader=self.leader, settings=filled, engine_port=engine_port)
            return server, launch
        launch = self.launcher.launch(self.engine.python, checkpoint, filled, port=port, cpu_build=cpu_build)
        server = EngineServer(launch.command, env=launch.env, port=port, health_path=launch.health_path,
                              log_path=log_path)
        return server, launch


def node_address() -> str | None:
    """The address other nodes reach this one at (the node worker's ``--address``), which vLLM binds to."""
    return os.environ.get("D0_NODE_ADDRESS") or None


def _log_tail(server: EngineServer, lines: int = 40) -> str:
    return "\n".join(server.log_text().splitlines()[-lines:])


def _serve(endpoint: Endpoint, workload: Workload, vocab: int, batch: int, settings: dict, progress) -> dict:
    """One trial's serving: the workload once, or a goodput search over loads where the workload asks for one."""
    if workload.goodput_search:
        return goodput_trial(endpoint, workload, vocab, batch, settings, progress)
    run = run_requests(endpoint, workload.measured_requests(vocab), warmup=workload.warmup(vocab, batch),
                       in_flight=workload.in_flight_limit(batch), timeout_s=workload.timeout_s)
    failed = [record.error for record in run.records if record.error]
    return {"metrics": summarize(run.records, workload.slo), "requests": len(run.records), "failed": failed,
            "any_failed": bool(failed),
            "client_cpu_s_per_request": run.client_cpu_s_per_request, "in_flight": workload.in_flight_limit(batch)}


def run_trials(session: Session, settings: dict, clients: list[dict], workload: Workload, startup_timeout_s: float,
               first_id: int, progress) -> list[dict]:
    """One engine start and the trials served by it (a trial per client setting)."""
    server, launch = session.server(settings)
    shown = {"settings": session.settings(settings), "command": launch.shell(), "env": launch.env}
    trials = []
    try:
        server.start()
        progress(f"starting {session.engine.name} ({', '.join(f'{k}={v}' for k, v in settings.items())})")
        startup_s = server.wait_healthy(startup_timeout_s)
        vocab = session.vocab
        # The closed loop's default concurrency is what the engine batches at most, as the proxy sweep's is.
        batch = settings.get("max_num_seqs", 1)
        for offset, client in enumerate(clients):
            trial_workload = Workload.from_dict({**workload.as_dict(), **client})
            in_flight = trial_workload.in_flight_limit(batch)
            progress(f"serving {trial_workload.requests} requests, concurrency {in_flight}")
            rss = _PeakRss(server.process.pid)
            rss.start()
            try:
                served = _serve(Endpoint(server.base_url, "d0"), trial_workload, vocab, batch, settings, progress)
            except TimeoutError as error:
                raise EngineFailed("timed out", str(error)) from None
            finally:
                peak = rss.finish()
            if served["any_failed"]:
                server.settle()
            if not server.alive():
                raise server.failure("exited", "the engine exited while serving")
            metrics = {**served["metrics"], "peak_memory_bytes": peak,
                       "peak_memory_source": "resident memory of the engine's processes, sampled while serving"}
            failed = served["failed"]
            status = "ok" if metrics.get("completed") == served["requests"] else "failed"
            trials.append(ServingTrial(
                id=first_id + offset, **shown, client=client, status=status,
                reason=None if status == "ok" else f"{len(failed)} requests failed: {failed[0]}",
                startup_s=startup_s, metrics=Metrics.from_dict(metrics),
                client_cpu_s_per_request=served["client_cpu_s_per_request"],
                workload=TrialWorkload(requests=trial_workload.requests, arrival=trial_workload.arrival,
                                       concurrency=served["in_flight"]),
                goodput=Goodput.from_dict(served.get("goodput"))).as_dict())
        if session.quality is not None and trials:
            # While this start is up: its numerics against the release (once per numerics over the sweep).
            session.quality.check(Endpoint(server.base_url, "d0"), shown["settings"],
                                  session.served_checkpoint(shown["settings"]))
            if not server.alive():
                raise server.failure("exited", "the engine exited while its answers were checked")
    except EngineFailed as error:
        done = len(trials)
        trials += [ServingTrial(id=first_id + done + index, **shown, client=client, status="failed",
                                cause=error.cause, reason=error.reason, startup_s=server.healthy_after_s,
                                log_tail=_log_tail(server),
                                workload=TrialWorkload(requests=workload.requests, arrival=workload.arrival)).as_dict()
                   for index, client in enumerate(clients[done:])]
    finally:
        server.stop()
    return trials


def deciding_figure(workload: Workload) -> str:
    """What picks the winner: goodput per device where the workload asks for a goodput search (the highest load
    meeting the SLOs, over TP x PP x DP devices: a layout of twice the devices must serve twice as much to win),
    goodput under the SLOs when it has SLOs, else output tokens/s."""
    if workload.slo and workload.goodput_search:
        return "goodput_per_device"
    return "goodput_requests_per_s" if workload.slo else "output_tokens_per_s"


def figure_of(trial: dict, figure: str) -> float:
    """A trial's deciding figure (0 where it has none: a goodput search that met the SLOs at no load)."""
    if figure == "goodput_per_device":
        return (trial.get("goodput") or {}).get("goodput_per_device") or 0
    return trial["metrics"][figure] or 0


def _full_runs(trials: list[dict], workload: Workload) -> list[list[dict]]:
    """Per configuration (engine settings and client settings), its runs that served the whole workload (a smart
    search's short runs do not count), best first: by the median of the deciding figure, then of output tokens/s."""
    figure = deciding_figure(workload)
    runs: dict[str, list[dict]] = {}
    for trial in trials:
        if trial["status"] == "ok" and trial["workload"]["requests"] == workload.requests:
            key = json.dumps({"settings": trial["settings"], "client": trial["client"]}, sort_keys=True)
            runs.setdefault(key, []).append(trial)
    return sorted(runs.values(), reverse=True, key=lambda group: (
        median_run(figure_of(trial, figure) for trial in group),
        median_run(trial["metrics"]["output_tokens_per_s"] for trial in group)))


def best_trial(trials: list[dict], workload: Workload) -> dict | None:
    """The pick among configurations that served the whole workload, judged as ``sweep.verdict`` judges: the
    highest median of the deciding figure (goodput under the SLOs, else output tokens/s) over each configuration's
    runs, confirmed only when all its runs are above the runner-up's. Returns the pick's median run (its figures are
    one real run's, for the recipe) with ``runs`` (the deciding figure of each run), ``spread`` (their median, mean,
    range) and ``verdict`` (``verdict.judge``'s, the runner-up in it); None when nothing served."""
    figure = deciding_figure(workload)
    groups = _full_runs(trials, workload)
    # Ranked already (ties broken by output tokens/s): judge's sort is stable, so a tie keeps that order.
    verdict = judge([{"settings": group[0]["settings"], "client": group[0]["client"],
                      "trial_ids": [trial["id"] for trial in group],
                      "runs": [figure_of(trial, figure) for trial in group]} for group in groups], figure)
    if verdict is None:
        return None
    chosen = next(group for group in groups if [trial["id"] for trial in group] == verdict["winner"]["trial_ids"])
    ordered = sorted(chosen, key=lambda trial: figure_of(trial, figure))
    winner = verdict["winner"]
    return {**ordered[(len(ordered) - 1) // 2], "runs": winner["runs"],
            "spread": {key: winner[key] for key in ("count", "median", "mean", "min", "max", "spread")},
            "verdict": verdict}


def serve_repeated(session: Session, settings: dict, clients: list[dict], workload: Workload,
                   startup_timeout_s: float, first_id: int, runs: int, progress) -> list[dict]:
    """One engine start serving each client setting ``runs`` times, interleaved (c1, c2, c1, c2...: a slow spell of
    the node does not fall on one configuration's runs only), numbered from ``first_id``; a client setting's runs
    after its first are marked ``repeat``. A failure is recorded once per client setting, not once per planned run
    (a start that failed fails them all the same way)."""
    kept: list[dict] = []
    seen: set[str] = set()
    for trial in run_trials(session, settings, clients * runs, workload, startup_timeout_s, first_id, progress):
        client = json.dumps(trial["client"], sort_keys=True)
        if trial["status"] != "ok" and any(other["status"] != "ok" and other["client"] == trial["client"]
                                           for other in kept):
            continue
        if client in seen:
            trial["repeat"] = True
        seen.add(client)
        kept.append(trial)
    for offset, trial in enumerate(kept):
        trial["id"] = first_id + offset
    return kept


def repeat_finalists(session: Session, trials: list[dict], workload: Workload, startup_timeout_s: float,
                     progress) -> dict:
    """The fallback that keeps the rule: serve the leading ``FINALISTS`` configurations again until each has
    ``MIN_RUNS`` runs of the whole workload (appended to ``trials``, marked ``repeat``). The searches already serve
    every full-workload run ``MIN_RUNS`` times within its engine start (``serve_repeated``), so this starts an
    engine only where a repeat failed part-way; finalists sharing engine settings share that start. A configuration
    is served again once at most (a failed repeat leaves it with too few runs, which the verdict says). Returns the
    repeats' runs and engine starts."""
    served_again: set[str] = set()
    repeats, starts = 0, 0
    while True:
        missing = []
        for group in _full_runs(trials, workload)[:FINALISTS]:
            key = json.dumps({"settings": group[0]["settings"], "client": group[0]["client"]}, sort_keys=True)
            if len(group) < MIN_RUNS and key not in served_again:
                served_again.add(key)
                missing.append((group[0]["settings"], group[0]["client"], MIN_RUNS - len(group)))
        if not missing:
            return {"runs": repeats, "engine_starts": starts}
        by_start: dict[str, tuple[dict, list[list[dict]]]] = {}
        for settings, client, count in missing:
            by_start.setdefault(json.dumps(settings, sort_keys=True), (settings, []))[1].append([client] * count)
        for settings, per_client in by_start.values():
            clients = [client for round_ in itertools.zip_longest(*per_client) for client in round_
                       if client is not None]
            progress(f"serving the finalists again ({len(clients)} runs, one engine start) so that each has "
                     f"{MIN_RUNS} runs")
            again = run_trials(session, settings, clients, workload, startup_timeout_s, len(trials),
                               lambda message: None)
            for trial in again:
                trial["repeat"] = True
            trials += again
            repeats, starts = repeats + len(again), starts + 1


def run_search(session: Session, groups: list[tuple[dict, list[dict]]], workload: Workload, params: dict,
               progress) -> tuple[list[dict], dict]:
    """The trials of every configuration (grid: one engine start per group, its client settings reusing it), or of
    successive halving over them; every run of the whole workload is served ``MIN_RUNS`` times within its engine
    start (a start costs far more than serving a workload: 40-100 s on a CPU node, minutes for a large checkpoint
    on GPUs), so that ``best_trial`` judges repeated figures at no extra start; ``repeat_finalists`` makes up
    for repeats that failed. Returns the trials and the search's outcome (strategy, trials run, requests served,
    seconds, ``repeats``: the extra runs and the extra engine starts they took)."""
    timeout = params["startup_timeout_s"]
    started = time.perf_counter()
    if params["search"] != "grid":
        configs = [EngineConfiguration(settings, client) for settings, clients in groups for client in clients]
        in_start: list[dict] = []

        def run_trial(config: EngineConfiguration, trial_workload: Workload) -> dict:
            # A short rung's run only ranks; a full run is judged, so it is served MIN_RUNS times in its start.
            runs = MIN_RUNS if trial_workload.requests == workload.requests else 1
            first, *again = serve_repeated(session, config.settings, [config.client], trial_workload, timeout, 0,
                                           runs, lambda message: None)
            in_start.extend(again)
            return first

        outcome = SEARCHES[params["search"]](configs, workload, run_trial,
                                    lambda fraction, message: progress(0.05 + 0.8 * fraction, message),
                                    space=engine_space(session.settings))
        trials = outcome.pop("trials")
        for trial in in_start:
            trials.append({**trial, "id": len(trials)})
    else:
        trials = []
        for index, (settings, clients) in enumerate(groups):
            def step(message, index=index):
                progress(0.05 + 0.8 * index / len(groups), f"configuration {index + 1} of {len(groups)}: {message}")

            trials += serve_repeated(session, settings, clients, workload, timeout, len(trials), MIN_RUNS, step)
        outcome = {"strategy": "grid", "configurations": sum(len(clients) for _, clients in groups)}
    finalists = repeat_finalists(session, trials, workload, timeout, lambda message: progress(0.85, message))
    outcome.update(trials_run=sum(trial["status"] != "skipped" for trial in trials),
                   requests_served=sum((trial.get("workload") or {}).get("requests") or 0 for trial in trials
                                       if trial["status"] != "skipped"),
                   seconds=time.perf_counter() - started,
                   repeats={"runs": sum(bool(trial.get("repeat")) for trial in trials),
                            "engine_starts": finalists["engine_starts"]})
    return trials, outcome


def run_serve_sweep(params: dict, progress) -> dict:
    """The serve sweep with ``params`` as the stage checked them, every parameter given (``stage.py``). On a group
    of nodes (a ``rendezvous``), node rank 0 runs the sweep over engines that span them all and the other nodes
    follow it (``deployment``)."""
    if not isinstance(params.get("config"), dict):
        raise ValueError("a serve sweep needs the model's config.json, as a JSON object, in params['config']")
    engines = configured_engines()
    if params["engine"] not in engines:
        raise ServeSweepFailed(f"this node offers no {params['engine']} engine; start its worker with "
                               f"--engine {params['engine']}=/path/to/its/python (or set D0_ENGINES)")
    engine = engines[params["engine"]]
    described = engine.probe()
    if not described["usable"]:
        raise ServeSweepFailed(f"{engine.name} at {engine.python} is unusable: {described['reason']}")
    given = params.get("workload") or {}
    if params.get("prompts_file"):
        given = {**given, **read_prompts_file(params["prompts_file"])}
    workload = Workload.from_dict(given)
    rendezvous = Rendezvous.from_params(params.get("rendezvous"))
    split = split_over_nodes(params["settings"], rendezvous.nodes if rendezvous else 1)
    stop_servers_on_sigterm()
    started = time.perf_counter()
    with workdirs.workdir("d0-serve-") as work:
        work = Path(work)
        progress(0.0, "preparing the checkpoint")
        checkpoint, weights, tensors = _weights(params, work)
        deployment = {"nodes": rendezvous.nodes if rendezvous else 1, "split": split,
                      "hostnames": list(rendezvous.hostnames) if rendezvous else [],
                      "master_addr": rendezvous.master_addr if rendezvous else None,
                      "layout": layout_of(params["settings"])}
        if rendezvous is not None and rendezvous.node_rank > 0:
            return {**_follow(params, engine, described, checkpoint, work / "logs", rendezvous, workload, progress),
                    "weights": weights, "deployment": deployment, "plan": params.get("plan"),
                    "seconds": time.perf_counter() - started}
        leader = Leader(rendezvous, params["join_timeout_s"]) if rendezvous is not None else None
        try:
            if leader is not None:
                progress(0.01, f"waiting for {rendezvous.nodes - 1} node(s) to join the deployment")
                deployment["joined_after_s"] = leader.wait_for_nodes()
            needed = workload.max_sequence_tokens() + 16
            session = Session(engine, described, checkpoint, work / "logs", max_model_len=max(256, needed),
                              leader=leader)
            result = _lead(session, params, workload, weights, progress)
        except DeploymentFailed as failed:
            leader.end("failed", str(failed))
            raise ServeSweepFailed(str(failed)) from None
        except BaseException as error:
            if leader is not None:
                leader.end("failed", f"{type(error).__name__}: {error}"[:500])
            raise
        if leader is not None:
            leader.end("done")
    progress(1.0, "done")
    return {"engine": described, "weights": weights, "tensors": tensors, **result, "deployment": deployment,
            "plan": params.get("plan"), "seconds": time.perf_counter() - started}


def _weights(params: dict, work: Path) -> tuple[Path, dict, dict]:
    """The checkpoint every engine start serves (the node's folder, or a validation checkpoint written from the
    same seed on every node), what it is, and its tensors checked against the config and the layout."""
    if params.get("weights_path"):
        checkpoint = Path(params["weights_path"])
        weights = {"kind": "checkpoint", "path": str(checkpoint), "description": "the node's checkpoint folder",
                   "real": True}
    elif params.get("demo_weights"):
        demo = make_demo_checkpoint()
        checkpoint = Path(demo["path"])
        check_demo_config(params["config"], checkpoint)
        weights = {"kind": "checkpoint", "path": str(checkpoint), "real": True,
                   "description": f"d0's demo model, {demo['name']} with its real weights ({demo['source']})"}
    else:
        checkpoint = work / "checkpoint"
        weights = {"kind": "validation checkpoint", **write_validation_checkpoint(params["config"], checkpoint)}
    layout = {key: params["settings"].get(key, 1) for key in ("tensor_parallel_size", "pipeline_parallel_size")}
    try:
        tensors = check_checkpoint(checkpoint, layout=layout)
    except CheckpointRefused as refusal:
        raise ServeSweepFailed(f"the checkpoint was refused before any engine started: {refusal}") from None
    return checkpoint, weights, tensors


def prepare_variants(params: dict, session: Session, progress) -> dict[str, dict]:
    """The quantized variants the sweep serves beside the checkpoint as shipped, made on this node by the engine's
    own environment (``variants``) into the node's cache, where a later sweep (and the recipe) finds them again."""
    from .variants import VariantFailed, cached_variant, missing_cpu_flags

    made = {}
    for index, name in enumerate(params["variants"]):
        missing = missing_cpu_flags(name) if session.described.get("cpu_build") else []
        if missing:
            # vLLM's CPU build has that variant's kernel only in its libraries for these instruction sets.
            session.skipped_variants[name] = (f"vLLM's CPU build serves {name} only on a CPU with "
                                              f"{', '.join(missing)}, which this node's lacks")
            continue
        progress(0.02 + 0.03 * index / len(params["variants"]), f"preparing the variant {name}")
        try:
            made[name] = cached_variant(name, checkpoint=session.checkpoint, engine_python=session.engine.python)
        except VariantFailed as error:
            raise ServeSweepFailed(f"the variant {name} could not be made: {error}") from None
    return made


def trial_lengths(session: Session, workload: Workload, trial: dict) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of each request a trial served: the sweep's workload with the trial's client
    settings, at the trial's request count (a smart search's short rungs serve fewer)."""
    served = (trial.get("workload") or {}).get("requests") or workload.requests
    trial_workload = Workload.from_dict({**workload.as_dict(), **trial["client"], "requests": served})
    return [(len(request.prompt_ids), request.output_tokens)
            for request in trial_workload.measured_requests(session.vocab)]


def predict_trials(session: Session, trials: list[dict], workload: Workload, hardware: dict | None,
                   calibration: dict | None) -> None:
    """Sets each served trial's ``prediction`` (``prediction.trial_prediction``: the roofline from the node's
    env-check figures, calibrated on the cluster's earlier trials where ``calibration`` is given) beside its
    measured metrics: the prediction ledger's entries. A cost model that fails is said on the trial, not fatal."""
    from .prediction import CostModels, trial_prediction

    models = CostModels()
    for trial in trials:
        if trial["status"] != "ok":
            continue
        try:
            trial["prediction"] = trial_prediction(models, session.served_checkpoint(trial["settings"]), trial,
                                                   trial_lengths(session, workload, trial), hardware, calibration)
        except Exception as error:
            trial["prediction"] = {"available": False,
                                   "reason": f"the cost model failed: {type(error).__name__}: {error}"}


def _lead(session: Session, params: dict, workload: Workload, weights: dict, progress) -> dict:
    """The sweep itself (on one node, or on node rank 0 of a deployment): its trials, best, recipe, correctness."""
    grid = params["grid"] or ({} if params["configurations"] else DEFAULT_GRID)
    groups = engine_configurations(params["settings"], grid) if grid else []
    for given in params["configurations"]:
        client = {key: given[key] for key in CLIENT_KEYS if key in given}
        groups.append(({**params["settings"], **{k: v for k, v in given.items() if k not in CLIENT_KEYS}},
                       [client]))
    latest = [0.0]  # the quality checks run inside the search: they report at the search's own fraction

    def step(fraction: float, message: str) -> None:
        latest[0] = fraction
        progress(fraction, message)

    if weights.get("real"):
        session.variants = prepare_variants(params, session, progress)
        session.quality = QualityCheck(Path(params.get("reference_path") or session.checkpoint),
                                       tokens=params["correctness_tokens"], variants=session.variants,
                                       accuracy=accuracy_settings(params),
                                       progress=lambda message: progress(latest[0], message))
        if params["variants"] != [AS_SHIPPED]:
            groups = [({**settings, "variant": name}, clients) for name in params["variants"]
                      if name in session.variants for settings, clients in groups]
    try:
        trials, search = run_search(session, groups, workload, params, step)
    except ReferenceUnavailable as error:
        raise ServeSweepFailed(str(error)) from None
    quality = None
    if session.quality is not None:
        progress(0.86, "judging each configuration's answers and accuracy against the reference")
        quality = session.quality.finish()
        session.quality.mark(trials)
    best = best_trial(trials, workload)
    if best is None:
        causes = sorted({f"{trial.get('cause', trial['status'])}: {trial['reason']}"[:300] for trial in trials})
        raise ServeSweepFailed(f"no configuration of {len(trials)} served its workload"
                               + (" and passed its checks against the reference" if quality else "") + ": "
                               + "; ".join(causes))
    predict_trials(session, trials, workload, params.get("hardware"), params.get("calibration"))
    best = {**best, "prediction": next(trial.get("prediction") for trial in trials if trial["id"] == best["id"])}
    try:
        # The cost model builds the checkpoint on torch's meta device; imported here so that the stage's
        # declaration (PARAMETERS, checked by the web tier) is importable without torch.
        from .prediction import prediction

        predicted = prediction(session.checkpoint, best, trial_lengths(session, workload, best),
                               params.get("hardware"))
    except Exception as error:  # the prediction is beside the measurement; its failure is said, not fatal
        predicted = {"available": False, "reason": f"the cost model failed: {type(error).__name__}: {error}"}
    # The recipe keeps the best trial's ledger entry: what d0 predicted for it beside what it measured.
    predicted["ledger"] = best["prediction"]
    correctness = None
    if quality is not None:
        chosen = next(entry for entry in quality["entries"] if entry["numerics"] == numerics_of(best["settings"]))
        correctness = {**chosen["correctness"], "kind": "real weights", "numerics": chosen["label"],
                       "reference": quality["reference"]}
        weights = {**weights, **variant_weights(session.variants.get(best["settings"].get("variant", AS_SHIPPED)))}
    elif params["correctness"]:
        progress(0.87, "checking correctness: greedy tokens of the engine and of transformers")
        correctness = check_correctness(session, best["settings"], vocab=session.vocab,
                                        tokens=params["correctness_tokens"],
                                        startup_timeout_s=params["startup_timeout_s"])
    return {"workload": workload.as_dict(), "grid": grid, "configurations": params["configurations"],
            "settings": params["settings"], "trials": trials,
            "best": ServingBest(id=best["id"], settings=best["settings"], client=best["client"],
                                metrics=Metrics.from_dict(best["metrics"]), runs=best["runs"],
                                spread=best["spread"]).as_dict(),
            "verdict": best["verdict"],
            "recipe": {**recipe(best, session.described, weights), "prediction": predicted},
            "correctness": correctness, "engine_starts": session.starts, "search": search,
            "quality": quality if quality is not None else {"note": "no accuracy check: random weights"},
            "variants": variant_summary(trials, quality, session.variants) if quality is not None else [],
            "variants_skipped": session.skipped_variants,
            "metric_definitions": DEFINITIONS}


def _follow(params: dict, engine, described: dict, checkpoint: Path, logs: Path, rendezvous: Rendezvous,
            workload: Workload, progress) -> dict:
    """A node rank above 0: each engine start node rank 0 announces, run headless here until it says stop."""
    progress(0.02, f"joining {rendezvous.name(0)}'s deployment at {rendezvous.master_addr}:{rendezvous.master_port}")
    try:
        follower = Follower(rendezvous, params["join_timeout_s"], layout_of(params["settings"]))
        # Between two starts node rank 0 serves a trial, or checks correctness (an engine start of its own and a
        # transformers reference): the longest it may be silent.
        idle_s = 2 * params["startup_timeout_s"] + 2 * workload.timeout_s + 300
        launcher, starts, index = LAUNCHERS[engine.name], [], 1
        while (start := follower.next_start(index, idle_s)) is not None:
            port = free_port()
            role = NodeRole(rendezvous.nodes, rendezvous.node_rank, rendezvous.master_addr, start["engine_port"],
                            node_address())
            launch = launcher.launch(engine.python, checkpoint, start["settings"], port=port,
                                     cpu_build=bool(described.get("cpu_build")), role=role)
            server = EngineServer(launch.command, env=launch.env, port=port, health_path=launch.health_path,
                                  log_path=logs / f"engine-{index}.log")
            progress(0.05 + 0.9 * min(index, 20) / 20,
                     f"engine start {index}: running headless for {rendezvous.name(0)}")
            starts.append({**follower.serve(index, server), "command": launch.shell()})
            index += 1
        ended = follower.ended()
    except DeploymentFailed as failed:
        raise ServeSweepFailed(str(failed)) from None
    if ended.get("status") == "failed":
        raise ServeSweepFailed(f"{rendezvous.name(0)} ended the deployment: {ended.get('reason') or 'it failed'}")
    progress(1.0, "done")
    return {"role": "follower", "node_rank": rendezvous.node_rank, "engine": described, "engine_starts": len(starts),
            "starts": starts}
