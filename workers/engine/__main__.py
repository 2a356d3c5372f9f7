"""Engine commands for node operators: ``python -m workers.engine <verb> [...] --json``.

The pages, the API and the tests use the same functions, so what an operator sees here is what d0 stores.
Each capability's ``cli`` module offers ``add_parser(verbs)`` and ``run(args[, progress]) -> dict`` for its verb
(``envcheck.cli`` has two, probe and envcheck).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect
import json
import os
import sys

from .progress import StderrProgress

# verb -> (module, attribute naming the verb object in it, or None for the module itself). A command imports only
# its own verb's module: the coverage verb's module alone imports torch, transformers and the tracing machinery,
# which the analyze verb has no use for.
VERB_MODULES = {
    "probe": ("envcheck.cli", "probe"),
    "envcheck": ("envcheck.cli", "envcheck"),
    "analyze": ("analysis.cli", None),
    "coverage": ("coverage.cli", None),
    "shard": ("sharding.cli", None),
    "sweep": ("sweep.cli", None),
    "serve": ("serving.cli", None),
    "bench-endpoint": ("serving.endpoint_cli", None),
    "ledger": ("serving.ledger_cli", None),
    "demo-model": ("models.demo", None),
}


# Verbs that only read a config and build shapes on the meta device, then exit: the cyclic garbage collector finds
# nothing to free there, yet its passes over the objects torch's and transformers' imports create cost about a fifth
# of a cold analyze's CPU (2 of 10 s for Kimi-K2, for 8 MiB more peak memory). Every other verb gets the collector
# back once its modules are imported, with those modules frozen out of its passes.
WITHOUT_COLLECTOR = frozenset({"analyze", "probe", "ledger"})


def load_verb(name: str):
    module_name, attribute = VERB_MODULES[name]
    module = importlib.import_module(f"{__package__}.{module_name}")
    return getattr(module, attribute) if attribute else module


def _requested_verb(argv: list[str]) -> str | None:
    """The verb named on the command line (the first word that is not an option), when it is a known one."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in VERB_MODULES else None


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
    argv = sys.argv[1:] if argv is None else argv
    # Only the named verb's parser is built; a bare --help, a typo or no verb at all lists every verb.
    requested = _requested_verb(argv)
    collecting = gc.isenabled()
    gc.disable()
    try:
        loaded = {name: load_verb(name) for name in ([requested] if requested else VERB_MODULES)}
        for verb in loaded.values():
            verb.add_parser(verbs)
        args = parser.parse_args(argv)
        verb = loaded[args.verb]
        if args.verb not in WITHOUT_COLLECTOR and collecting:
            gc.freeze()
            gc.enable()
        return _run(verb, args)
    finally:
        if collecting:  # main() called in a process that goes on (a test) leaves the collector as it found it
            gc.enable()


def _run(verb, args: argparse.Namespace) -> int:
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
    transformers' modules costs about a second of CPU and cleans up nothing the verb did not (its
    work folders and child processes are gone by the time it returns; nothing here registers an atexit hook)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
