"""The floor d0's dispatch is measured against (benchmarks/dispatch_vs_floor.py): a bare Celery chain with the same
hops as an env_probe job (client → control → node → control) and d0's worker settings, but no Django, no database,
no signing and no stage. The last task marks the chain done in Redis, where the client polls for it as d0's client
polls the job row.

    celery -A benchmarks.floor_chain worker -Q floor.control -c 2    # the control plane's pool
    celery -A benchmarks.floor_chain worker -Q floor.node -c 1       # a node
"""

import os

import redis
from celery import Celery

CONTROL_QUEUE = os.environ.get("FLOOR_CONTROL_QUEUE", "floor.control")
NODE_QUEUE = os.environ.get("FLOOR_NODE_QUEUE", "floor.node")

app = Celery("floor", broker=os.environ.get("FLOOR_BROKER_URL"), fixups=[])
app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
                task_ignore_result=True, task_serializer="json", accept_content=["json"],
                worker_hijack_root_logger=False)
_results = None


def results() -> redis.Redis:
    global _results
    if _results is None:
        _results = redis.Redis.from_url(app.conf.broker_url)
    return _results


@app.task(name="floor.dispatch")
def dispatch(key: str) -> None:
    app.send_task("floor.run", args=[key], queue=NODE_QUEUE)


@app.task(name="floor.run")
def run(key: str) -> None:
    app.send_task("floor.finished", args=[key], queue=CONTROL_QUEUE)


@app.task(name="floor.finished")
def finished(key: str) -> None:
    results().set(key, "succeeded", ex=600)
