"""Dispatch cost: an env_probe job's submit → succeeded against the floor, a bare Celery chain (client → control →
node → control: the hops of a job dispatched through the control plane) with the same worker settings but no
Django (benchmarks/floor_chain.py). d0's submit dispatches the first stage itself (client → node → control), so the
same chain without its first hop is measured too, interleaved, and both ratios are printed: the goal is the first,
the second is what d0 costs over bare Celery on its own path.

Both run at once on one Redis (and d0 on PostgreSQL): d0's control worker (with its beat) and a node worker, as the
test harness starts them, beside the floor's two workers. Rounds are interleaved (d0, the floor and the 2-hop
floor, each first in turn), after warm-up rounds that are not counted. Each client polls its own "done" mark every
millisecond: the job row for d0, a Redis key for the floor. Then:

- the SQL statements the control plane runs for one single-stage job (submit with its dispatch, the node's started,
  progress and finished reports, signatures checked), counted in this process on the same services;
- a burst: ``--burst`` jobs submitted at once against as many floor chains: jobs/s to a terminal state, how many
  never got there, how many stage runs have no ``started``.

With ``--trace``, the stack's processes also time every Celery task event (benchmarks/celery_trace/) and the d0
rounds are broken down step by step: the median time from each event to the next, from submit to the client seeing
"succeeded" (where the milliseconds go that the ratio counts).

    python benchmarks/dispatch_vs_floor.py [--rounds 20] [--burst 200] [--trace]

Needs PostgreSQL and Redis (scripts/ensure-services.sh); it makes and drops a database of its own.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POSTGRES = os.environ.get("D0_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
DATABASE = "d0_bench_dispatch"
BROKER = os.environ.get("D0_BENCH_REDIS", "redis://127.0.0.1:6379/14")
PREFIX = f"d0bench-{uuid.uuid4().hex[:6]}"
os.environ.update(DATABASE_URL=f"{POSTGRES}/{DATABASE}", D0_BROKER_URL=BROKER, DJANGO_SETTINGS_MODULE="d0web.settings")
os.environ.setdefault("D0_VAR_DIR", tempfile.mkdtemp(prefix="d0-bench-var-"))


def fresh_database() -> None:
    import psycopg

    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")


fresh_database()

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from adaptation.choices import TERMINAL_STATUSES, TeamRole  # noqa: E402
from adaptation.jobs import services as jobs  # noqa: E402
from adaptation.models import AdaptationJob, Cluster, Membership, Node, StageRun, Team  # noqa: E402
from tests.harness import WorkerStack, wait_for  # noqa: E402
from workers import control, protocol, signing  # noqa: E402

POLL = 0.001
TERMINAL = list(TERMINAL_STATUSES)


def setup_team():
    from django.contrib.auth import get_user_model

    team = Team.objects.create(name="Bench", slug="bench")
    user = get_user_model().objects.create_user("bench", password="a-long-bench-password")
    Membership.objects.create(team=team, user=user, role=TeamRole.ADMIN)
    return team, user, Cluster.objects.create(team=team, name="local", expected_devices_per_node=1)


def d0_round(team, user, cluster, windows: list | None = None) -> float:
    started, wall = time.perf_counter(), time.time()
    job = jobs.submit_job(team=team, user=user, cluster=cluster, stages=["env_probe"])
    deadline = time.monotonic() + 60
    # A plain cursor, not the ORM: the client's polling must not take the CPU the workers measured here need.
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT status FROM adaptation_adaptationjob WHERE id = %s", [job.pk])
            status = cursor.fetchone()[0]
            if status in TERMINAL or time.monotonic() > deadline:
                break
            time.sleep(POLL)
    elapsed = time.perf_counter() - started
    if windows is not None:
        windows.append((wall, wall + elapsed))
    if status != "succeeded":
        job = AdaptationJob.objects.get(pk=job.pk)
        raise RuntimeError(f"job {job.pk} {status}: {job.error}\n{job.log}")
    return elapsed


def traced_steps(trace_dir: Path, windows: list[tuple[float, float]]) -> list[tuple[str, float]]:
    """The median milliseconds from each d0 task event to the next within the rounds' windows (submit to the
    client's last poll), in the order they happen; the job's own events only (no heartbeat or liveness check)."""
    job_tasks = {protocol.RUN_STAGE, protocol.STAGE_STARTED, protocol.STAGE_PROGRESS,
                 protocol.STAGE_FINISHED}
    events = sorted((float(when), f"{event} {name.rpartition('.')[2]}")
                    for path in trace_dir.glob("*.log") for when, event, name in
                    (line.split() for line in path.read_text().splitlines()) if name in job_tasks)
    steps: dict[str, list[float]] = {}
    for begin, end in windows:
        previous = begin
        inside = [(when, what) for when, what in events if begin <= when <= end] + [(end, "client sees it")]
        for when, what in inside:
            steps.setdefault(what, []).append((when - previous) * 1e3)
            previous = when
    return [(what, statistics.median(gaps)) for what, gaps in steps.items()]


def floor_round(app, results: redis.Redis, queue: str, first: str = "floor.dispatch") -> float:
    """One chain from its ``first`` task: floor.dispatch on the control queue (three hops), or floor.run on the
    node's (two, as d0's submit now goes)."""
    key = f"{PREFIX}.done.{uuid.uuid4().hex}"
    started = time.perf_counter()
    app.send_task(first, args=[key], queue=queue)
    while results.get(key) is None:
        time.sleep(POLL)
    return time.perf_counter() - started


class Recorded:
    """Stands in for the broker while statements are counted in this process (the messages go nowhere)."""

    def __init__(self):
        self.control = self

    def send_task(self, *args, **kwargs):
        pass

    def revoke(self, *args, **kwargs):
        pass


def statements_per_job(team, user) -> dict[str, list[str]]:
    """The control plane's SQL statements for one env_probe job, phase by phase, through the same task functions
    the control worker runs (signed reports included); BEGIN and COMMIT are listed too, counted apart."""
    cluster = Cluster.objects.create(team=team, name="counted", expected_devices_per_node=1)
    key = signing.NodeKey.generate()
    Node.objects.create(cluster=cluster, hostname="counted", queue_name=f"{PREFIX}.nowhere",
                               last_heartbeat=timezone.now(), public_key=key.public_key, key_id=key.key_id)
    real = jobs.celery_app
    jobs.celery_app = Recorded
    counts = {}
    try:
        def phase(name, call):
            with CaptureQueriesContext(connection) as captured:
                call()
            counts[name] = [query["sql"] for query in captured.captured_queries]
            if os.environ.get("D0_BENCH_SHOW_SQL"):
                print(name, *(sql[:160] for sql in counts[name]), sep="\n  ")

        holder = {}
        phase("submit", lambda: holder.update(job=jobs.submit_job(team=team, user=user, cluster=cluster,
                                                                  stages=["env_probe"])))
        run = StageRun.objects.get(job=holder["job"])
        phase("started", lambda: control.stage_started(*key.message(protocol.STAGE_STARTED, [run.pk])))
        phase("progress", lambda: control.stage_progress(*key.message(protocol.STAGE_PROGRESS, [run.pk, 0.1, "x"])))
        phase("finished", lambda: control.stage_finished(*key.message(protocol.STAGE_FINISHED,
                                                                      [run.pk, True, {"host": {}}, "", ""],
                                                                      ran_for=0.002)))
        assert AdaptationJob.objects.get(pk=run.job_id).status == "succeeded"
    finally:
        jobs.celery_app = real
    return counts


def burst(team, user, cluster, app, results, queue, size: int) -> dict:
    started = time.perf_counter()
    ids = [jobs.submit_job(team=team, user=user, cluster=cluster, stages=["env_probe"]).pk for _ in range(size)]
    pending = AdaptationJob.objects.filter(pk__in=ids).exclude(status__in=TERMINAL)
    deadline = time.monotonic() + 300
    # A plain cursor, as the rounds poll: the ORM's query took ~1 ms of the CPU the stack needs every 10 ms.
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM adaptation_adaptationjob WHERE id = ANY(%s) AND NOT status = ANY(%s)",
                           [ids, TERMINAL])
            if not cursor.fetchone()[0]:
                break
            time.sleep(0.01)
    d0_seconds = time.perf_counter() - started
    keys = [f"{PREFIX}.burst.{uuid.uuid4().hex}" for _ in range(size)]
    started = time.perf_counter()
    for key in keys:
        app.send_task("floor.dispatch", args=[key], queue=queue)
    while sum(1 for value in results.mget(keys) if value is not None) < size and time.monotonic() < deadline + 300:
        time.sleep(0.01)
    floor_seconds = time.perf_counter() - started
    rows = AdaptationJob.objects.filter(pk__in=ids)
    return {"d0": size / d0_seconds, "floor": size / floor_seconds,
            "succeeded": rows.filter(status="succeeded").count(), "not terminal": pending.count(),
            "started unset": StageRun.objects.filter(job_id__in=ids, started__isnull=True).count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--burst", type=int, default=200, help="jobs in the burst (0: none)")
    parser.add_argument("--trace", action="store_true", help="break the d0 rounds down by Celery task event")
    args = parser.parse_args()
    # A timeout's SIGTERM must still stop the workers this run started (they live in sessions of their own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    call_command("migrate", interactive=False, verbosity=0)
    team, user, cluster = setup_team()
    counts = statements_per_job(team, user)
    results = redis.Redis.from_url(BROKER)
    results.flushdb()
    logs = Path(tempfile.mkdtemp(prefix="d0-bench-dispatch-"))
    trace_dir, windows = (logs / "trace", []) if args.trace else (None, None)
    if trace_dir:
        trace_dir.mkdir()
        os.environ.update(D0_TRACE_DIR=str(trace_dir), PYTHONPATH=os.pathsep.join(
            [str(ROOT / "benchmarks" / "celery_trace"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    stack = WorkerStack(logs, os.environ["DATABASE_URL"], BROKER)
    os.environ["D0_CONTROL_QUEUE"] = stack.control_queue  # this process submits: to the stack's control queue
    floor_control, floor_node = f"{PREFIX}.floor.control", f"{PREFIX}.floor.node"
    floor_env = {**stack.env, "FLOOR_BROKER_URL": BROKER, "FLOOR_CONTROL_QUEUE": floor_control,
                 "FLOOR_NODE_QUEUE": floor_node}
    os.environ.update(FLOOR_BROKER_URL=BROKER)
    from benchmarks import floor_chain
    celery = [sys.executable, "-m", "celery", "-A", "benchmarks.floor_chain", "worker", "--without-gossip",
              "--without-mingle", "--loglevel", "warning"]
    try:
        stack.start_control()
        stack.start_node("bench/local", f"{PREFIX}-node", heartbeat=2)
        for name, queue, pool in (("floor-control", floor_control, "2"), ("floor-node", floor_node, "1")):
            stack.start(name, [*celery, "-Q", queue, "-c", pool, "--hostname", f"{PREFIX}-{name}@%h"], floor_env)
        wait_for(lambda: Node.objects.filter(cluster=cluster, status="online").exists(), 120, "the node")
        d0, floor, floor_2 = [], [], []
        measures = [lambda: d0.append(d0_round(team, user, cluster, windows)),
                    lambda: floor.append(floor_round(floor_chain.app, results, floor_control)),
                    lambda: floor_2.append(floor_round(floor_chain.app, results, floor_node, "floor.run"))]
        for _ in range(args.warmup):
            d0_round(team, user, cluster)
            floor_round(floor_chain.app, results, floor_control)
            floor_round(floor_chain.app, results, floor_node, "floor.run")
        for index in range(args.rounds):
            for measure in measures[index % 3:] + measures[:index % 3]:  # each first in turn
                measure()
        print(f"submit -> succeeded, {args.rounds} interleaved rounds (ms):")
        print(f"{'':<12}{'p50':>8}{'p90':>8}{'min':>8}")
        for name, figures in (("d0", d0), ("floor", floor), ("floor 2-hop", floor_2)):
            ordered = sorted(figures)
            p90 = ordered[int(0.9 * (len(ordered) - 1))]
            print(f"{name:<12}{statistics.median(ordered) * 1e3:>8.1f}{p90 * 1e3:>8.1f}{ordered[0] * 1e3:>8.1f}")
        ratio = statistics.median(mine / theirs for mine, theirs in zip(d0, floor, strict=True))
        ratio_2 = statistics.median(mine / theirs for mine, theirs in zip(d0, floor_2, strict=True))
        print(f"median ratio d0 / floor (per round; client -> control -> node -> control): {ratio:.2f}x "
              "(goal <= 2.0x)")
        print(f"median ratio d0 / floor 2-hop (per round; client -> node -> control, d0's own hops): {ratio_2:.2f}x")
        if trace_dir:
            print("d0 step by step (median ms from the previous event; received: the worker's main process, "
                  "start/end: its pool process):")
            for what, gap in traced_steps(trace_dir, windows):
                print(f"  {gap:6.2f}  {what}")
        # A probe sends no started or progress report (a node sends neither in a stage's first half-second; its
        # finished report says how long it ran): their cost is printed apart, for longer stages.
        job = {name: statements for name, statements in counts.items() if name not in ("started", "progress")}
        transactions = sum(statements.count("BEGIN") for statements in job.values())
        print(f"SQL statements per env_probe job: {sum(map(len, job.values())) - 2 * transactions} (goal <= 15) "
              f"in {transactions} transactions (BEGIN/COMMIT not counted): "
              + ", ".join(f"{name} {len(statements) - 2 * statements.count('BEGIN')}"
                          for name, statements in job.items())
              + f"; a longer stage's started report: {len(counts['started']) - 2 * counts['started'].count('BEGIN')}, "
              f"each of its progress reports: {len(counts['progress'])}")
        if args.burst:
            figures = burst(team, user, cluster, floor_chain.app, results, floor_control, args.burst)
            print(f"burst of {args.burst}: d0 {figures['d0']:.1f} jobs/s, floor {figures['floor']:.1f} chains/s "
                  f"(goal >= 50 jobs/s); succeeded {figures['succeeded']}, not terminal {figures['not terminal']}, "
                  f"stage runs without started {figures['started unset']}")
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop_all()
        connection.close()
        fresh_database()


if __name__ == "__main__":
    main()
