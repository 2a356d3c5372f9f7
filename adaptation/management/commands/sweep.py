"""``manage.py sweep MODEL``: a tuning sweep from a terminal, with a progress bar on stderr.

MODEL is a model's id or name (any team's), a catalog slug (``qwen3-0.6b``) or a path to a config.json file. The
sweep runs here, in this process, through the same engine as the node stage (``workers.engine.sweep.run_sweep``),
serving the reduced model unless ``--full-model`` is given.

    python manage.py sweep qwen3-0.6b --batch-sizes 1,2,4 --page-sizes 16,32 --precisions fp32,bf16 --out var/sweep

Lengths take a fixed ``32``, a uniform range ``16-64`` or a list ``16,32,48`` (used in turn).
"""

from __future__ import annotations

import csv
import json
import logging
import re
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from adaptation.intake import catalog
from adaptation.sweeps.services import spreadsheet_safe
from adaptation.models import ModelSpec
from workers.engine.sweep.search import SEARCH_HELP, SEARCHES

# _Log.run in workers/engine/sweep/search.py announces each trial as it starts with this message.
TRIAL_STARTED = re.compile(r"^trial (?P<number>\d+): (?P<label>.*)$")
# transformers' continuous batching logs each trial's start and stop at INFO on its own handler, which Django's root
# level (INFO) lets through; it would bury the trial lines and break the progress bar. Shown with --verbosity 2.
ENGINE_LOGGERS = ("ContinuousBatchingLogger",)
CSV_FIELDS = ("id", "rung", "precision", "batch_size", "page_size", "max_batch_tokens", "requests", "status",
              "reason", "output_tokens_per_s", "requests_per_s", "ttft_p50_s", "tpot_p50_s", "itl_p50_s",
              "e2e_latency_p50_s", "peak_memory_bytes", "roofline_efficiency", "roofline_bound", "best")
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
    from workers.engine.sweep.benchmark_model import PRECISIONS

    names = list(dict.fromkeys(part.strip().lower() for part in str(text).split(",") if part.strip()))
    unknown = [name for name in names if name not in PRECISIONS]
    if not names or unknown:
        raise CommandError(f"--precisions takes comma-separated names among {', '.join(PRECISIONS)}; "
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


def _p50(metrics: dict | None, key: str):
    distribution = (metrics or {}).get(key)
    return distribution.get("p50") if isinstance(distribution, dict) else None


def _count(number, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def trial_row(trial: dict, best_id) -> dict:
    params, metrics, roofline = trial["params"], trial.get("metrics") or {}, trial.get("roofline") or {}
    return {"id": trial["id"], "rung": trial.get("rung"), **params,
            "requests": (trial.get("workload") or {}).get("requests"), "status": trial["status"],
            "reason": trial.get("reason") or "", "output_tokens_per_s": metrics.get("output_tokens_per_s"),
            "requests_per_s": metrics.get("requests_per_s"), "ttft_p50_s": _p50(metrics, "ttft_s"),
            "tpot_p50_s": _p50(metrics, "tpot_s"), "itl_p50_s": _p50(metrics, "itl_s"),
            "e2e_latency_p50_s": _p50(metrics, "e2e_latency_s"),
            "peak_memory_bytes": metrics.get("peak_memory_bytes"), "roofline_efficiency": roofline.get("efficiency"),
            "roofline_bound": roofline.get("bound"), "best": trial["id"] == best_id}


def format_table(rows: list[dict]) -> list[str]:
    """The trials as an aligned table, the best one starred, then each failed or skipped trial's reason."""
    header = ("id", "precision", "batch", "page", "max tokens", "requests", "status", "out tok/s", "TTFT p50",
              "TPOT p50", "roofline eff", "bound")
    cells = [header] + [(
        ("*" if row["best"] else "") + str(row["id"]), row["precision"], str(row["batch_size"]), str(row["page_size"]),
        str(row["max_batch_tokens"]), _number(row["requests"], "d"), row["status"],
        _number(row["output_tokens_per_s"], ".1f"), _ms(row["ttft_p50_s"]), _ms(row["tpot_p50_s"]),
        _number(row["roofline_efficiency"], ".0%"), row["roofline_bound"] or "-") for row in rows]
    widths = [max(len(line[column]) for line in cells) for column in range(len(header))]
    numeric = {0, 2, 3, 4, 5, 7, 8, 9, 10}
    lines = ["  ".join(cell.rjust(width) if column in numeric else cell.ljust(width)
                       for column, (cell, width) in enumerate(zip(line, widths, strict=True))).rstrip()
             for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    for row in rows:
        if row["reason"]:
            lines.append(f"  trial {row['id']} {row['status']}: {row['reason']}")
    return lines


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

        rows = [trial_row(trial, (result.get("best") or {}).get("id")) for trial in result["trials"]]
        if out is not None:
            self._write(out, result, rows, say)
        if as_json:
            self.stdout.write(json.dumps(result, indent=2, sort_keys=True, default=str))
            return
        self._summary(result, rows)

    def _write(self, out: Path, result: dict, rows: list[dict], say) -> None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "sweep.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
            with open(out / "trials.csv", "w", newline="") as stream:
                writer = csv.DictWriter(stream, fieldnames=CSV_FIELDS)
                writer.writeheader()
                writer.writerows({key: spreadsheet_safe(value) for key, value in row.items()} for row in rows)
        except OSError as error:
            raise CommandError(f"cannot write the results to {out}: {error}") from None
        say(f"Wrote {out / 'sweep.json'} (the full result) and {out / 'trials.csv'} ({_count(len(rows), 'trial')})")

    def _summary(self, result: dict, rows: list[dict]) -> None:
        model, backend = result.get("model") or {}, result.get("backend") or {}
        shape = (f"reduced to {model.get('layers')} of {model.get('full_layers')} layers" if model.get("reduced")
                 else f"full model, {model.get('layers')} layers")
        self.stdout.write("")
        self.stdout.write(f"Model: {model.get('model_type')}, {shape}; served by {backend.get('name')} on "
                          f"{backend.get('device', '?')}")
        for line in format_table(rows):
            self.stdout.write(line)
        best = result.get("best")
        if best:
            params, metrics = best["params"], best.get("metrics") or {}
            efficiency = (best.get("roofline") or {}).get("efficiency")
            self.stdout.write(
                f"Best: trial {best['id']}: {params['precision']}, batch size {params['batch_size']}, page size "
                f"{params['page_size']}, max batch tokens {params['max_batch_tokens']}: "
                f"{_number(metrics.get('output_tokens_per_s'), '.1f')} output tokens/s, "
                f"TTFT p50 {_ms(_p50(metrics, 'ttft_s'))}, TPOT p50 {_ms(_p50(metrics, 'tpot_s'))}, "
                f"roofline efficiency {_number(efficiency, '.0%')}")
        else:
            self.stdout.write("Best: none (no trial served the full workload)")
        search = result.get("search") or {}
        self.stdout.write(f"Search: {search.get('strategy')}, {_count(search.get('trials_run'), 'trial')} run of "
                          f"{_count(search.get('configurations'), 'configuration')}, "
                          f"{_count(search.get('requests_served'), 'request')} served, "
                          f"{_number(search.get('seconds'), '.1f')} s")
