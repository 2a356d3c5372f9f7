"""``manage.py sweep MODEL``: a tuning sweep from a terminal, with a progress bar on stderr.

MODEL is a model's id or name (any team's), a catalog slug (``qwen3-0.6b``) or a path to a config.json file. The
sweep runs here, in this process, through the same engine as the node stage (``workers.engine.sweep.run_sweep``),
serving the reduced model unless ``--full-model`` is given. It prints what ``python -m workers.engine sweep`` prints
(``workers.engine.sweep.cli.format_summary``: the trial rows of ``trial_row``), and ``--out``'s trials.csv is the
report page's CSV.

    python manage.py sweep qwen3-0.6b --batch-sizes 1,2,4 --page-sizes 16,32 --precisions fp32,bf16 --out var/sweep

Lengths take a fixed ``32``, a uniform range ``16-64`` or a list ``16,32,48`` (used in turn).
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from adaptation.intake import catalog
from adaptation.models import ModelSpec
from workers.engine.sweep.cli import format_summary
from workers.engine.sweep.result import SweepResult
from workers.engine.sweep.search import SEARCH_HELP, SEARCHES
from workers.engine.sweep.trial_row import sweep_table

# _Log.run in workers/engine/sweep/search.py announces each trial as it starts with this message.
TRIAL_STARTED = re.compile(r"^trial (?P<number>\d+): (?P<label>.*)$")
# transformers' continuous batching logs each trial's start and stop at INFO on its own handler, which Django's root
# level (INFO) lets through; it would bury the trial lines and break the progress bar. Shown with --verbosity 2.
ENGINE_LOGGERS = ("ContinuousBatchingLogger",)
HOW_TO_NAME = ("name a model by its id (e.g. 12), its name (any team's), a catalog slug (e.g. {slugs}, ...), "
               "or a path to a config.json file")


def _positive_ints(text: str, option: str) -> list[int]:
    parts = [part.strip() for part in str(text).split(",") if part.strip()]
    if not parts:
        raise CommandError(f"--{option} needs at least one value, e.g. 1,2,4")
    values = []
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise CommandError(f"--{option} takes comma-separated positive integers such as 1,2,4; {part!r} is not one")
        values.append(int(part))
    return list(dict.fromkeys(values))


def _positive_int(text, option: str) -> int:
    text = str(text).strip()
    if not text.isdigit() or int(text) < 1:
        raise CommandError(f"--{option} takes a positive integer, not {text!r}")
    return int(text)


def _length(text, option: str):
    """``32`` (fixed), ``16-64`` (uniform, both ends included) or ``16,32,48`` (used in turn)."""
    text = str(text).strip()
    if re.fullmatch(r"\d+\s*-\s*\d+", text):
        low, high = (int(part) for part in text.split("-"))
        if low < 1 or high < low:
            raise CommandError(f"--{option}: a range needs 1 <= low <= high, not {text!r}")
        return {"uniform": [low, high]}
    try:
        values = [_positive_int(part, option) for part in text.split(",") if part.strip()]
    except CommandError:
        values = []
    if not values:
        raise CommandError(f"--{option} takes a positive length such as 32, a range 16-64 or a list 16,32,48, "
                           f"not {text!r}")
    return values[0] if len(values) == 1 else values


def _precisions(text: str) -> list[str]:
    from workers.engine.sweep.benchmark_model import SERVED_DTYPES

    names = list(dict.fromkeys(part.strip().lower() for part in str(text).split(",") if part.strip()))
    unknown = [name for name in names if name not in SERVED_DTYPES]
    if not names or unknown:
        raise CommandError(f"--precisions takes comma-separated names among {', '.join(SERVED_DTYPES)}; "
                           f"not {', '.join(unknown) or repr(text)}")
    return names


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CommandError(f"cannot read {what} {path}: {error}") from None
    if not isinstance(data, dict):
        raise CommandError(f"{what} {path} must hold a JSON object ({{...}}), not {type(data).__name__}")
    return data


def resolve_model(name: str) -> tuple[dict, str]:
    try:
        return _resolve_model(name)
    except DatabaseError as error:
        raise CommandError(f"cannot look {name!r} up among the models in the database ({error}); a catalog slug "
                           f"or a path to a config.json file works without it") from None


def _resolve_model(name: str) -> tuple[dict, str]:
    """(config.json dict, a label saying where it came from) for a model named on the command line: a path to an
    existing file first, then a model's id, then a catalog slug (read without the database), then a model's exact
    name, in any team."""
    path = Path(name).expanduser()
    if path.is_file():
        return _read_json(path, "the config file"), f"config file {path}"
    if name.isdigit():
        spec = ModelSpec.objects.select_related("team").filter(pk=int(name)).first()
        if spec is None:
            raise CommandError(f"there is no model with id {name}; {HOW_TO_NAME.format(slugs=_some_slugs())}")
        return spec.config, f"model {spec.pk} {spec.name!r} (team {spec.team.slug})"
    entry = catalog.BY_SLUG.get(name) or catalog.BY_SLUG.get(name.lower())
    if entry is not None:
        return entry.config(), f"catalog {entry.slug} ({entry.hf_id})"
    named = list(ModelSpec.objects.select_related("team").filter(name=name).order_by("pk"))
    if len(named) == 1:
        spec = named[0]
        return spec.config, f"model {spec.pk} {spec.name!r} (team {spec.team.slug})"
    if len(named) > 1:
        choices = ", ".join(f"{spec.pk} (team {spec.team.slug})" for spec in named)
        raise CommandError(f"{len(named)} models are named {name!r}; name one by its id: {choices}")
    if name.endswith(".json") or "/" in name:
        raise CommandError(f"no such config file: {name}; {HOW_TO_NAME.format(slugs=_some_slugs())}")
    raise CommandError(f"unknown model {name!r}: {HOW_TO_NAME.format(slugs=_some_slugs())}")


def _some_slugs() -> str:
    return ", ".join(entry.slug for entry in catalog.CATALOG if entry.slug in ("qwen3-0.6b", "llama-3.2-1b",
                                                                               "gpt-oss-20b"))


def _count(number, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


class _Unstyled:
    """A management command's stderr as StderrProgress wants a stream: no added newline, no colour."""

    def __init__(self, wrapper):
        self.wrapper = wrapper

    def write(self, text: str) -> None:
        self.wrapper.write(text, style_func=str, ending="")

    def flush(self) -> None:
        self.wrapper.flush()

    def isatty(self) -> bool:
        return self.wrapper.isatty()


class TrialLines:
    """The sweep's progress callback: draws StderrProgress's bar, and prints one line per finished trial (the engine
    reports a trial when it starts, so a trial has finished when the next one starts or the sweep is done)."""

    def __init__(self, bar, say):
        self.bar, self.say = bar, say
        self.running: tuple[str, str, float] | None = None

    def __call__(self, fraction: float, message: str) -> None:
        started = TRIAL_STARTED.match(message)
        if self.running and (started or message == "done"):
            number, label, since = self.running
            if self.bar.active:  # clear the bar's line so the trial's line does not land in the middle of it
                self.bar.stream.write("\r\x1b[2K")
                self.bar.stream.flush()
            self.say(f"finished run {number} in {time.perf_counter() - since:.2f} s: {label}")
            self.running = None
        if started:
            self.running = (started["number"], started["label"], time.perf_counter())
        self.bar(fraction, message)


class Command(BaseCommand):
    help = "Run a tuning sweep of a model here, with a progress bar: trials' throughput, latency and roofline."

    def add_arguments(self, parser):
        parser.add_argument("model", help="a model's id or name, a catalog slug (e.g. qwen3-0.6b) or a config.json")
        parser.add_argument("--batch-sizes", default="1,2,4", help="concurrency / batch sizes, e.g. 1,2,4")
        parser.add_argument("--page-sizes", default="16", help="KV-cache page (block) sizes in tokens, e.g. 16,32")
        parser.add_argument("--precisions", default="fp32", help="fp32, bf16, fp16, int8 (dynamic), e.g. fp32,bf16")
        parser.add_argument("--max-batch-tokens", default="256", help="tokens per forward step at most, e.g. 256")
        parser.add_argument("--prompt-len", default="32", help="prompt tokens: 32, 16-64 or 16,32,48")
        parser.add_argument("--output-len", default="16", help="output tokens: 16, 8-24 or 8,16")
        parser.add_argument("--requests", default="8", help="measured requests per trial")
        parser.add_argument("--search", choices=tuple(SEARCHES), default="grid", help=SEARCH_HELP)
        parser.add_argument("--device", help="torch device (default: the first accelerator, else the CPU)")
        parser.add_argument("--hardware", help="JSON file with the bandwidth and FLOP/s (default: measured here)")
        parser.add_argument("--full-model", action="store_true", help="serve the full model, not the reduced one")
        parser.add_argument("--out", help="folder to write sweep.json (the full result) and trials.csv into")
        parser.add_argument("--json", action="store_true", help="print the full result as JSON instead of a table")

    def handle(self, *args, **options):
        grid = {"precision": _precisions(options["precisions"]),
                "batch_size": _positive_ints(options["batch_sizes"], "batch-sizes"),
                "page_size": _positive_ints(options["page_sizes"], "page-sizes"),
                "max_batch_tokens": _positive_ints(options["max_batch_tokens"], "max-batch-tokens")}
        workload = {"requests": _positive_int(options["requests"], "requests"),
                    "prompt_len": _length(options["prompt_len"], "prompt-len"),
                    "output_len": _length(options["output_len"], "output-len")}
        if options["search"] not in SEARCHES:
            raise CommandError(f"--search takes {', '.join(SEARCHES)}, not {options['search']!r}")
        hardware = _read_json(Path(options["hardware"]), "the hardware file") if options["hardware"] else None
        out = Path(options["out"]).expanduser() if options["out"] else None
        if out is not None and out.exists() and not out.is_dir():
            raise CommandError(f"--out {out} exists and is not a folder")
        config, source = resolve_model(options["model"])
        as_json = options["json"]
        say = self.stderr.write if as_json else self.stdout.write

        from workers.engine.progress import StderrProgress
        from workers.engine.sweep import run_sweep

        configurations = len(grid["precision"]) * len(grid["batch_size"]) * len(grid["page_size"]) * len(
            grid["max_batch_tokens"])
        if not as_json:
            say(f"Sweeping {source}: {_count(configurations, 'configuration')}, "
                f"{_count(workload['requests'], 'request')} each, {options['search']} search")
        bar = StderrProgress(_Unstyled(self.stderr))
        progress = TrialLines(bar, (lambda line: None) if as_json else say)
        loggers = [logging.getLogger(name) for name in ENGINE_LOGGERS]
        levels = [logger.level for logger in loggers]
        if options["verbosity"] < 2:
            for logger in loggers:
                logger.setLevel(logging.WARNING)
        try:
            result = run_sweep(config, grid=grid, workload=workload, search=options["search"],
                               device=options["device"], hardware=hardware, progress=progress,
                               reduce=not options["full_model"])
        except (ValueError, RuntimeError) as error:  # a config the engine cannot serve, an unavailable backend
            raise CommandError(f"the sweep could not run: {error}") from error
        finally:
            bar.done()
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)

        if out is not None:
            self._write(out, result, say)
        if as_json:
            self.stdout.write(json.dumps(result, indent=2, sort_keys=True, default=str))
            return
        for line in format_summary(result).splitlines():
            self.stdout.write(line)

    def _write(self, out: Path, result: dict, say) -> None:
        table = sweep_table(SweepResult.from_dict(result))
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "sweep.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
            (out / "trials.csv").write_text(table.csv(), newline="")
        except OSError as error:
            raise CommandError(f"cannot write the results to {out}: {error}") from None
        say(f"Wrote {out / 'sweep.json'} (the full result) and {out / 'trials.csv'} "
            f"({_count(len(table.trials), 'trial')})")
