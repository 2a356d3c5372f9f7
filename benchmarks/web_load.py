"""The web tier under load at 10,000 jobs: 20 concurrent clients against gunicorn on 127.0.0.1, per endpoint.

Seeds a PostgreSQL database of its own (dropped and made again each run: 300 models with real catalog configs and
their analysis, 10,000 jobs, 20,000 stage runs), then, for each gunicorn setting (the production one from
d0web/gunicorn.conf.py and the candidates it was chosen from), in rounds with the settings interleaved: starts
gunicorn, runs the clients over each endpoint in turn (bounded by --requests and --seconds per endpoint), prints
requests, p50, p95 and req/s per endpoint, the CPU time per request of gunicorn's processes and of the PostgreSQL
backends serving them (the figure that does not depend on what else the machine runs), and the PSS of each
gunicorn worker after the load.

A setting written ``NAME@DIR`` runs gunicorn from another checkout of d0 (e.g. ``git worktree add /tmp/before
HEAD~3``), so that a change is measured against what it replaces in the same run, interleaved:
``--settings production,production@/tmp/before``.

    python benchmarks/web_load.py [--rounds 2] [--requests 600] [--seconds 6] [--clients 20]
                                  [--database-url postgres://postgres@127.0.0.1:5432/d0_web_load]
                                  [--broker redis://127.0.0.1:6379/13] [--settings production,sync-2,...]

Loopback only. Goal: every endpoint's p95 under 200 ms with the production setting.
"""

import argparse
import http.client
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import wait_for  # noqa: E402
from tests.test_zero_setup import free_port  # noqa: E402

# Each: gunicorn's options after the app. "production" is the config file alone (of the checkout gunicorn runs
# from), as `manage.py up` and docker-compose.yml run it; the others are what it was chosen from.
SETTINGS = {
    "production": ["--config", "d0web/gunicorn.conf.py"],
    "sync-2": ["--worker-class", "sync", "--workers", "2"],
    "sync-4": ["--worker-class", "sync", "--workers", "4"],
    "gthread-2x4": ["--worker-class", "gthread", "--workers", "2", "--threads", "4"],
    "gthread-2x4-preload": ["--worker-class", "gthread", "--workers", "2", "--threads", "4", "--preload"],
    "gthread-4x4-preload": ["--worker-class", "gthread", "--workers", "4", "--threads", "4", "--preload"],
}

JOBS, MODELS, STAGES_PER_JOB = 10_000, 300, 2


# --- the database ---------------------------------------------------------------------------------------


def recreate_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def seed() -> dict:
    """The rows, bulk-created; returns what the clients need (credentials, ids)."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone
    from rest_framework.authtoken.models import Token

    from adaptation.choices import TeamRole
    from adaptation.intake.catalog import CONFIGS
    from adaptation.models import (AdaptationJob, Cluster, ControlWorker, Membership, ModelSpec, Node, StageRun,
                                   Team)
    from workers.engine.analysis import ConfigError, analyze

    call_command("migrate", interactive=False, verbosity=0)
    rng = random.Random(15)
    now = timezone.now()
    user = get_user_model().objects.create_user("bench", password="a-long-bench-password")
    team = Team.objects.create(name="Bench", slug="bench")
    Membership.objects.create(team=team, user=user, role=TeamRole.ADMIN)
    # Another team's rows, so scoping has something to leave out.
    other = Team.objects.create(name="Other", slug="other")
    cluster = Cluster.objects.create(team=team, name="bench", expected_devices_per_node=8)
    other_cluster = Cluster.objects.create(team=other, name="other")
    nodes = Node.objects.bulk_create([Node(cluster=cluster, hostname=f"gpu-{i:02d}", queue_name=f"q.bench.{i}",
                                           status="online", last_heartbeat=now) for i in range(8)])
    ControlWorker.objects.create(name="control@bench", last_seen=now)

    configs = []
    for path in sorted(CONFIGS.glob("*.json")):
        config = json.loads(path.read_text())
        try:
            analysis = analyze(config)
            json.dumps([config, analysis], allow_nan=False)  # what jsonb stores (a few releases say Infinity)
        except (ConfigError, ValueError):
            continue
        configs.append((config, analysis))
    models = ModelSpec.objects.bulk_create([
        ModelSpec(team=team if i % 10 else other, name=f"model-{i:03d}", config=configs[i % len(configs)][0],
                  analysis=configs[i % len(configs)][1], created_by=user)
        for i in range(MODELS)])
    ours = [model for model in models if model.team_id == team.pk]
    statuses = ["succeeded"] * 80 + ["failed"] * 15 + ["cancelled"] * 4 + ["running"]
    jobs = []
    for i in range(JOBS):
        status = rng.choice(statuses)
        created = now - timedelta(minutes=JOBS - i)
        mine = i % 20 != 0  # 1 in 20 jobs is the other team's
        jobs.append(AdaptationJob(
            team=team if mine else other, cluster=cluster if mine else other_cluster,
            model=rng.choice(ours) if mine else models[0], stages=["env_check", "op_coverage"],
            parameters={"op_coverage": {"compile": False}}, status=status, submitted_by=user,
            progress=1.0 if status != "running" else 0.5, started=created + timedelta(seconds=2),
            finished=None if status == "running" else created + timedelta(seconds=rng.randint(5, 600)),
            error="op_coverage: a rank exited with code 1" if status == "failed" else "",
            log="".join(f"12:00:{s:02d} stage {s} reported\n" for s in range(8)), celery_task_id=f"bench-{i}"))
    jobs = AdaptationJob.objects.bulk_create(jobs, batch_size=2000)
    runs = []
    for job in jobs:
        for kind in job.stages:
            done = job.status != "running" or kind == "env_check"
            runs.append(StageRun(
                job=job, kind=kind, node=nodes[job.pk % 8], node_name=nodes[job.pk % 8].hostname,
                status=job.status if done else "running", progress=1.0 if done else 0.4, started=job.started,
                finished=job.finished if done else None, message="done" if done else "bf16: 412 of 980 operators",
                result={"verdict": "pass", "devices": [{"kind": "cuda"}] * 8, "checks": [{"status": "pass"}] * 12}
                if kind == "env_check" and done else None))
    StageRun.objects.bulk_create(runs, batch_size=4000)
    with connection.cursor() as cursor:
        # bulk_create stamps every row's `created` with one time (auto_now_add): spread them as a real history.
        cursor.execute("UPDATE adaptation_adaptationjob SET created = %s - (%s - id) * interval '1 minute'",
                       [now, jobs[-1].pk])
        cursor.execute("UPDATE adaptation_modelspec SET created = %s - (%s - id) * interval '1 hour'",
                       [now, models[-1].pk])
        # What autovacuum does soon after a real load: planner statistics and the visibility map.
        cursor.execute("VACUUM ANALYZE")
    ours_jobs = [job for job in jobs if job.team_id == team.pk]
    return {"user": user.pk, "token": Token.objects.create(user=user).key,
            "finished_job": next(job.pk for job in reversed(ours_jobs) if job.status == "succeeded"),
            "running_job": next(job.pk for job in reversed(ours_jobs) if job.status == "running"),
            "team_jobs": len(ours_jobs)}


# A session of a user, signed in as the sign-in page does it: through the settings' last backend (the one that
# checks passwords), whose path the session keeps. Made by each checkout for itself (``session_of``): each version
# names its own backend, and a session naming one a version does not list is no session there.
SIGN_IN = """
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
user = get_user_model().objects.get(pk=USER)
session = SessionStore()
session.update({SESSION_KEY: str(user.pk), BACKEND_SESSION_KEY: settings.AUTHENTICATION_BACKENDS[-1],
                HASH_SESSION_KEY: user.get_session_auth_hash()})
session.create()
"""


def session_of(checkout: str, user_id: int, env: dict) -> str:
    """A session of ``user_id`` made by the checkout of d0 in ``checkout``."""
    code = f"import django; django.setup(); USER = {int(user_id)}\n{SIGN_IN}\nprint(session.session_key)"
    return subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env, check=True, capture_output=True,
                          text=True).stdout.split()[-1]


def endpoints(seeded: dict) -> dict[str, tuple[str, dict]]:
    from django.conf import settings

    page = {"Cookie": f"sessionid={seeded['session']}"}
    api = {"Authorization": f"Token {seeded['token']}"}
    last_page = -(-seeded["team_jobs"] // settings.D0_PAGE_SIZE)
    last_api_page = -(-seeded["team_jobs"] // settings.REST_FRAMEWORK["PAGE_SIZE"])
    return {
        "dashboard": ("/", page),
        "jobs page 1": ("/jobs/", page),
        f"jobs page {last_page - 10}": (f"/jobs/?page={last_page - 10}", page),
        "jobs ?status=failed": ("/jobs/?status=failed", page),
        "api jobs ?status=": ("/api/jobs/?status=failed", api),
        "api jobs ?ordering=-finished": ("/api/jobs/?ordering=-finished", api),
        f"api jobs page {last_api_page - 5}": (f"/api/jobs/?page={last_api_page - 5}", api),
        "models": ("/models/", page),
        "job detail": (f"/jobs/{seeded['finished_job']}/", page),
        "progress json": (f"/jobs/{seeded['running_job']}/progress/", page),
        "api status (anonymous)": ("/api/status/", {}),
        "api status (signed in)": ("/api/status/", api),
    }


# --- the server and the clients -------------------------------------------------------------------------


class Server:
    def __init__(self, setting: str, env: dict, log: Path):
        name, _, checkout = setting.partition("@")
        self.port = free_port()
        self.log = open(log, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "d0web.wsgi", "--bind", f"127.0.0.1:{self.port}", *SETTINGS[name],
             "--access-logfile", "-"],
            cwd=checkout or ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def answers(self) -> bool:
        try:
            status, _ = request(self.port, "/api/status/", {})
            return status == 200
        except OSError:
            return False

    def cpu_seconds(self) -> float:
        """User and system CPU time of gunicorn's master and workers so far."""
        import psutil

        processes = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        return sum(times.user + times.system for times in (process.cpu_times() for process in processes))

    def worker_pss_mib(self) -> list[float]:
        import psutil

        workers = psutil.Process(self.process.pid).children()
        return sorted(worker.memory_full_info().pss / 2**20 for worker in workers)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def request(port: int, path: str, headers: dict, connection=None) -> tuple[int, bytes]:
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    return response.status, response.read()


def load(port: int, path: str, headers: dict, clients: int, requests: int, seconds: float) -> dict:
    """``clients`` threads, each sending its next request when the last is answered (keep-alive where the server
    keeps the connection), until ``requests`` were sent or ``seconds`` passed."""
    tickets = itertools.count()
    deadline = time.monotonic() + seconds
    latencies, failures = [], []

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            while next(tickets) < requests and time.monotonic() < deadline:
                started = time.perf_counter()
                status, _ = request(port, path, headers, connection)
                latencies.append(time.perf_counter() - started)
                if status != 200:
                    failures.append(status)
        finally:
            connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"latencies": latencies, "seconds": time.perf_counter() - started, "failures": failures}


def database_cpu_seconds(database: str) -> dict[int, float]:
    """User and system CPU time so far of each PostgreSQL backend connected to ``database``, by process id (the
    server's own processes, whose titles read ``postgres: ... <user> <database> <client> <state>``)."""
    import psutil

    seconds = {}
    for process in psutil.process_iter(["cmdline"]):
        words = " ".join(process.info["cmdline"] or []).split()
        if words[:1] == ["postgres:"] and database in words:
            try:
                times = process.cpu_times()
            except psutil.Error:  # a backend that ended meanwhile
                continue
            seconds[process.pid] = times.user + times.system
    return seconds


def database_cpu_since(database: str, before: dict[int, float]) -> float:
    """The CPU time the backends used since ``before``: those that ended meanwhile (a connection past its
    CONN_MAX_AGE) are left out rather than subtracted."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in database_cpu_seconds(database).items())


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/d0_web_load")
    parser.add_argument("--broker", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"some of: {', '.join(SETTINGS)}")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=600, help="per endpoint, per round")
    parser.add_argument("--seconds", type=float, default=6.0, help="per endpoint, per round")
    args = parser.parse_args()
    chosen = args.settings.split(",")
    unknown = [name for name in chosen if name.partition("@")[0] not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")

    var = Path(tempfile.mkdtemp(prefix="d0-web-load-"))
    env = {**os.environ, "DATABASE_URL": args.database_url, "REDIS_URL": args.broker, "D0_VAR_DIR": str(var),
           "D0_DEBUG": "false", "DJANGO_SETTINGS_MODULE": "d0web.settings"}
    env.pop("D0_BROKER_URL", None)
    os.environ.update(env)
    import django

    django.setup()
    try:
        recreate_database(args.database_url)
        started = time.perf_counter()
        seeded = seed()
        print(f"seeded {JOBS} jobs ({seeded['team_jobs']} of the signed-in team's), {JOBS * STAGES_PER_JOB} stage "
              f"runs, {MODELS} models in {time.perf_counter() - started:.0f} s; {args.clients} clients, at most "
              f"{args.requests} requests or {args.seconds:g} s per endpoint per round, {args.rounds} rounds, "
              f"{os.cpu_count()} CPUs\n")
        targets = {name: endpoints({**seeded, "session": session_of(name.partition("@")[2] or ROOT, seeded["user"],
                                                                      env)}) for name in chosen}
        database = urlsplit(args.database_url).path.lstrip("/")
        results = {name: {endpoint: {"latencies": [], "seconds": 0.0, "failures": [], "cpu": 0.0, "database_cpu": 0.0,
                                      "client_cpu": 0.0}
                          for endpoint in targets[name]} for name in chosen}
        pss = {}
        for round_number in range(args.rounds):
            for name in (chosen if round_number % 2 == 0 else chosen[::-1]):
                server = Server(name, env, var / f"gunicorn-{name.replace('/', '_')}.log")
                try:
                    wait_for(server.answers, 60, f"gunicorn ({name})", interval=0.1)
                    for path, headers in targets[name].values():  # every worker's first requests are not counted
                        load(server.port, path, headers, args.clients, 2 * args.clients, 10)
                    for endpoint, (path, headers) in targets[name].items():
                        cpu, database_cpu = server.cpu_seconds(), database_cpu_seconds(database)
                        client_cpu = time.process_time()
                        measured = load(server.port, path, headers, args.clients, args.requests, args.seconds)
                        total = results[name][endpoint]
                        total["client_cpu"] += time.process_time() - client_cpu
                        total["cpu"] += server.cpu_seconds() - cpu
                        total["database_cpu"] += database_cpu_since(database, database_cpu)
                        total["latencies"] += measured["latencies"]
                        total["seconds"] += measured["seconds"]
                        total["failures"] += measured["failures"]
                    pss[name] = server.worker_pss_mib()
                finally:
                    server.stop()
        for name in chosen:
            setting, _, checkout = name.partition("@")
            print(f"## {name}: gunicorn {' '.join(SETTINGS[setting])}" + (f" (from {checkout})" if checkout else ""))
            print(f"{'endpoint':<30} {'requests':>8} {'p50 ms':>8} {'p95 ms':>8} {'req/s':>7} {'non-200':>7} "
                  f"{'CPU ms/req':>10} {'PG CPU ms/req':>13} {'client CPU':>10}")
            for endpoint, total in results[name].items():
                latencies = total["latencies"]
                print(f"{endpoint:<30} {len(latencies):>8} {percentile(latencies, 50) * 1000:>8.1f} "
                      f"{percentile(latencies, 95) * 1000:>8.1f} {len(latencies) / total['seconds']:>7.1f} "
                      f"{len(total['failures']):>7} {total['cpu'] / len(latencies) * 1000:>10.1f} "
                      f"{total['database_cpu'] / len(latencies) * 1000:>13.1f} "
                      f"{total['client_cpu'] / len(latencies) * 1000:>10.1f}")
            worst = max(percentile(total["latencies"], 95) for total in results[name].values())
            print(f"worst p95 {worst * 1000:.0f} ms (goal < 200 ms); worker PSS after the load: "
                  + ", ".join(f"{value:.0f} MiB" for value in pss[name]) + "\n")
    finally:
        shutil.rmtree(var, ignore_errors=True)


if __name__ == "__main__":
    main()
