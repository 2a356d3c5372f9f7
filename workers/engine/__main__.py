"""Engine commands for node operators: ``python -m workers.engine <verb> [...] --json``.

The pages, the API and the tests use the same functions, so what an operator sees here is what d0 stores.
Each capability's ``cli`` module offers ``add_parser(verbs)`` and ``run(args[, progress]) -> dict`` for its verb
(``envcheck.cli`` has two, probe and envcheck).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

from .analysis import cli as analyze_verb
from .coverage import cli as coverage_verb
from .envcheck import cli as envcheck_verbs
from .progress import StderrProgress
from .serving import cli as serve_verb
from .serving import endpoint_cli as endpoint_verb
from .sharding import cli as shard_verb
from .sweep import cli as sweep_verb

VERBS = {**envcheck_verbs.VERBS, "analyze": analyze_verb, "coverage": coverage_verb, "shard": shard_verb,
         "sweep": sweep_verb, "serve": serve_verb, "bench-endpoint": endpoint_verb}


def _print(result: dict, as_json: bool, verb) -> None:
    if as_json:
        json.dump(result, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif hasattr(verb, "format_summary"):
        print(verb.format_summary(result))
    else:
        for key, value in result.items():
            print(f"{key}: {json.dumps(value, indent=2, sort_keys=True)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.engine", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS.values():
        verb.add_parser(verbs)
    args = parser.parse_args(argv)
    verb = VERBS[args.verb]
    progress = StderrProgress()
    takes_progress = len(inspect.signature(verb.run).parameters) > 1
    try:
        result = verb.run(args, progress) if takes_progress else verb.run(args)
    except (ValueError, OSError) as error:  # bad input (ConfigError is a ValueError) or an unreadable file
        progress.done()
        print(f"error: {error}", file=sys.stderr)
        return 2
    progress.done()
    _print(result, args.json, verb)
    return 0


def exit_without_teardown(code: int) -> None:
    """Leave once the verb's output is written, without tearing the interpreter down: unloading torch's and
    transformers' modules costs about a second of CPU (issue 16 item 7) and cleans up nothing the verb did not (its
    work folders and child processes are gone by the time it returns; nothing here registers an atexit hook)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
