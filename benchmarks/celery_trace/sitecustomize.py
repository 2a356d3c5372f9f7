"""Timestamps of every Celery task event in the processes of a benchmark's worker stack, for
``benchmarks/dispatch_vs_floor.py --trace``: with this folder on ``PYTHONPATH`` and ``D0_TRACE_DIR`` set, each process
appends "<unix time> <event> <task name>" lines to ``$D0_TRACE_DIR/<pid>.log`` when it publishes a task, receives one
(the worker's main process), and starts and ends one (the pool process). Without ``D0_TRACE_DIR`` it does nothing.
"""

import os
import time

if os.environ.get("D0_TRACE_DIR"):
    from celery import signals

    _LOG = os.path.join(os.environ["D0_TRACE_DIR"], "{pid}.log")

    def _note(event: str, name) -> None:
        with open(_LOG.format(pid=os.getpid()), "a") as log:
            log.write(f"{time.time():.6f} {event} {name}\n")

    signals.before_task_publish.connect(lambda sender=None, **_: _note("publish", sender), weak=False)
    signals.task_received.connect(lambda request=None, **_: _note("received", request.name), weak=False)
    signals.task_prerun.connect(lambda task=None, **_: _note("start", task.name), weak=False)
    signals.task_postrun.connect(lambda task=None, **_: _note("end", task.name), weak=False)
