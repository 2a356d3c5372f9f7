"""A trial as a row of figures, declared once for every view of it: the report pages' trial tables (a sweep's, an
engine sweep's, an endpoint benchmark's), the CSV downloads, and the terminal tables of ``manage.py sweep`` and
``python -m workers.engine sweep|serve|bench-endpoint``.

A ``Column`` has a ``name`` (the CSV's header: the figure in its stored ``unit``, seconds, bytes; the page's header
names it on hover), a ``header`` (the tables'), the figure it reads from a trial (``result.SweepTrial`` or
``result.ServingTrial``) and how a table writes it (milliseconds, GiB); ``page`` and ``terminal`` say which tables
show it (the CSV has every column). A ``TrialTable`` is a result's trials under its kind's columns.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .result import EndpointBenchResult, ServeSweepResult, SweepResult

NONE = "—"
# A failure's reason beside its status on a page (the CSV and the terminal's list below the table give it whole).
REASON_CHARS = 120
# Runs of one configuration further apart than this (max - min over the median) are flagged: the figure is noisy.
NOISY_SPREAD = 0.25


@dataclass(frozen=True)
class Cell:
    """A figure as a table shows it: ``note`` a remark beside it (the runs' spread, a failure's reason), ``flag``
    whether it must not be taken at face value (``title`` says why), ``verbatim`` for settings shown as code."""

    text: str
    note: str = ""
    flag: bool = False
    title: str = ""
    verbatim: bool = False


def _number(spec: str, suffix: str = "") -> Callable[[Any], str]:
    return lambda value: NONE if value is None else format(value, spec) + suffix


def _milliseconds(seconds) -> str:
    return NONE if seconds is None else f"{seconds * 1000:.1f} ms"


def _bytes(count) -> str:
    if not count:
        return NONE
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def _plain(value) -> str:
    return NONE if value is None or value == "" else str(value)


def _settings(settings: dict | None) -> str:
    return ", ".join(f"{key}={value}" for key, value in (settings or {}).items())


@dataclass(frozen=True)
class Column:
    name: str
    header: str
    value: Callable[[Any], Any]
    unit: str = ""
    text: Callable[[Any], str] = _plain
    # A cell with more than the figure's text (a note, a flag); by default the text alone.
    cell: Callable[[Any], Cell] | None = None
    page: bool = True
    terminal: bool = False
    numeric: bool = True
    # Shown on the page only when some trial has it (a figure only some sweeps measure).
    only_if_given: bool = False

    def show(self, trial) -> Cell:
        return self.cell(trial) if self.cell else Cell(self.text(self.value(trial)))


def _metric(name: str):
    return lambda trial: getattr(trial.metrics, name) if trial.metrics else None


def _percentile(name: str, stat: str):
    def read(trial):
        distribution = getattr(trial.metrics, name) if trial.metrics else None
        return getattr(distribution, stat) if distribution else None
    return read


def _quality(trial) -> dict:
    quality = getattr(trial, "quality", None)
    return quality if isinstance(quality, dict) else {}


def _status(trial) -> Cell:
    cause = getattr(trial, "cause", None)
    reason = (trial.reason or "").strip()
    if len(reason) > REASON_CHARS:
        reason = reason[:REASON_CHARS - 1] + "…"
    # A trial whose numerics failed a check against the reference keeps its figures but is never the pick.
    failed_check = _quality(trial).get("verdict") not in (None, "pass")
    return Cell(f"{trial.status} ({cause})" if cause else _plain(trial.status), note=reason, flag=failed_check,
                title="its numerics failed a check against the reference: its figures are kept, it is never the pick"
                if failed_check else "")


def _throughput(trial) -> Cell:
    text = _number(".1f")(_metric("output_tokens_per_s")(trial))
    repeats = getattr(trial, "repeats", None)
    if not repeats or not repeats.count or repeats.count < 2 or repeats.spread is None:
        return Cell(text)
    noisy = repeats.spread > NOISY_SPREAD
    return Cell(text, note=f"({repeats.count} runs: {repeats.min:.1f} – {repeats.max:.1f}, {repeats.spread:.0%})",
                flag=noisy, title=f"the runs differ by more than {NOISY_SPREAD:.0%} of their median" if noisy else "")


def _efficiency(trial) -> Cell:
    efficiency = trial.efficiency
    if efficiency is None:
        return Cell(NONE)
    return Cell(efficiency.text, flag=efficiency.flagged, title=efficiency.note or "")


def _roofline(name: str):
    return lambda trial: getattr(trial.roofline, name) if trial.roofline else None


ID = Column("id", "id", lambda trial: trial.id, terminal=True)
RUNG = Column("rung", "rung", lambda trial: trial.rung)
REQUESTS = Column("requests", "requests", lambda trial: trial.workload.requests if trial.workload else None,
                  terminal=True)
STATUS = Column("status", "status", lambda trial: trial.status, cell=_status, terminal=True, numeric=False)
REASON = Column("reason", "reason", lambda trial: trial.reason, page=False, numeric=False)
# The serving metrics every trial has, as metrics.summarize defines them (vLLM's definitions).
METRICS = (
    Column("output_tokens_per_s", "out tok/s", _metric("output_tokens_per_s"), "tokens/s", _number(".1f"),
           cell=_throughput, terminal=True),
    Column("requests_per_s", "req/s", _metric("requests_per_s"), "requests/s", _number(".2f"), page=False),
    Column("ttft_p50_s", "TTFT p50", _percentile("ttft_s", "p50"), "s", _milliseconds, terminal=True),
    Column("ttft_p99_s", "TTFT p99", _percentile("ttft_s", "p99"), "s", _milliseconds),
    Column("tpot_p50_s", "TPOT p50", _percentile("tpot_s", "p50"), "s", _milliseconds, terminal=True),
    Column("tpot_p99_s", "TPOT p99", _percentile("tpot_s", "p99"), "s", _milliseconds),
    Column("itl_p50_s", "ITL p50", _percentile("itl_s", "p50"), "s", _milliseconds),
    Column("e2e_p50_s", "E2E p50", _percentile("e2e_latency_s", "p50"), "s", _milliseconds),
    Column("e2e_p99_s", "E2E p99", _percentile("e2e_latency_s", "p99"), "s", _milliseconds, page=False),
    Column("goodput_requests_per_s", "goodput (req/s)", _metric("goodput_requests_per_s"), "requests/s",
           _number(".2f")),
)
PEAK_MEMORY = Column("peak_memory_bytes", "peak memory", _metric("peak_memory_bytes"), "bytes", _bytes)

SWEEP_COLUMNS = (
    ID,
    Column("precision", "precision", lambda trial: trial.params.get("precision"), terminal=True, numeric=False),
    Column("batch_size", "batch", lambda trial: trial.params.get("batch_size"), terminal=True),
    Column("page_size", "page", lambda trial: trial.params.get("page_size"), terminal=True),
    Column("max_batch_tokens", "max tokens", lambda trial: trial.params.get("max_batch_tokens"), terminal=True),
    RUNG, REQUESTS, STATUS, *METRICS, PEAK_MEMORY,
    Column("roofline_efficiency", "roofline eff", lambda trial: trial.efficiency.figure if trial.roofline else None,
           cell=_efficiency, terminal=True),
    # A flagged efficiency has no figure: its own column says so (the ceiling is suspect, not the trial).
    Column("roofline_ceiling_suspect", "ceiling suspect",
           lambda trial: trial.efficiency.flagged if trial.roofline else None, page=False),
    Column("roofline_end_to_end_efficiency", "end-to-end eff", _roofline("end_to_end_efficiency"), page=False),
    Column("step_overhead_s", "step overhead", _roofline("overhead_seconds_per_step"), "s", page=False),
    Column("bound", "bound", _roofline("bound"), terminal=True, numeric=False),
    REASON,
)
def _predicted(metric: str):
    """What d0 predicted for a trial (the prediction ledger: the roofline, calibrated on the cluster's trials where
    it had some), beside its measured figure."""
    return lambda trial: ((trial.prediction or {}).get("predicted") or {}).get(metric)


def _prediction_basis(trial) -> str:
    prediction = trial.prediction or {}
    return prediction.get("basis") or prediction.get("reason") or ""


PREDICTED = (
    Column("predicted_output_tokens_per_s", "predicted tok/s", _predicted("output_tokens_per_s"), "tokens/s",
           _number(".1f"), only_if_given=True,
           cell=lambda trial: Cell(_number(".1f")(_predicted("output_tokens_per_s")(trial)),
                                   title=_prediction_basis(trial))),
    Column("predicted_ttft_s", "predicted TTFT", _predicted("ttft_s"), "s", _milliseconds, page=False),
    Column("predicted_tpot_s", "predicted TPOT", _predicted("tpot_s"), "s", _milliseconds, only_if_given=True),
    Column("predicted_peak_memory_bytes", "predicted memory", _predicted("peak_memory_bytes"), "bytes", _bytes,
           page=False),
    Column("prediction_basis", "prediction", _prediction_basis, page=False, numeric=False),
)
CLIENT = Column("client", "client", lambda trial: _settings(trial.client) or None, terminal=True, numeric=False,
                cell=lambda trial: Cell(_settings(trial.client) or NONE, verbatim=True))
SERVE_SWEEP_COLUMNS = (
    ID,
    Column("settings", "engine settings", lambda trial: _settings(trial.settings) or None, terminal=True,
           numeric=False, cell=lambda trial: Cell(_settings(trial.settings) or NONE, verbatim=True)),
    CLIENT, RUNG, REQUESTS, STATUS,
    # On real weights: the numerics served (variant, dtype) and its verdict against the reference.
    Column("numerics", "numerics", lambda trial: _quality(trial).get("label"), numeric=False, only_if_given=True),
    Column("quality", "quality", lambda trial: _quality(trial).get("verdict"), page=False, numeric=False),
    Column("startup_s", "start", lambda trial: trial.startup_s, "s", _number(".1f", " s")),
    *METRICS, PEAK_MEMORY, *PREDICTED, REASON,
)
ENDPOINT_BENCH_COLUMNS = (ID, CLIENT, RUNG, REQUESTS, STATUS, *METRICS, REASON)


def figure(columns: tuple[Column, ...], name: str, trial) -> str:
    """One column's figure of a trial as the tables write it (a summary line quoting the table)."""
    column = next(column for column in columns if column.name == name)
    return column.text(column.value(trial))


def spreadsheet_safe(value):
    """A cell a spreadsheet shows as text: a string that starts like a formula (=, +, -, @, tab, CR) gets a leading
    apostrophe (OWASP's CSV injection advice). The strings come from nodes, so they are not trusted."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


@dataclass(frozen=True)
class TrialRow:
    best: bool
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class TrialTable:
    """A result's trials under its columns; ``best_id``: the trial the result picked."""

    columns: tuple[Column, ...]
    trials: list
    best_id: int | None = None

    def is_best(self, trial) -> bool:
        return self.best_id is not None and trial.id == self.best_id

    def _rows(self, columns) -> list[TrialRow]:
        return [TrialRow(self.is_best(trial), tuple(column.show(trial) for column in columns)) for trial in self.trials]

    @property
    def page_columns(self) -> list[Column]:
        return [column for column in self.columns if column.page and not (
            column.only_if_given and all(column.value(trial) is None for trial in self.trials))]

    @property
    def page_rows(self) -> list[TrialRow]:
        return self._rows(self.page_columns)

    def records(self) -> list[dict]:
        """Each trial's figures by column name, in their stored units, and whether it is the best: the CSV's rows."""
        return [{**{column.name: column.value(trial) for column in self.columns}, "best": self.is_best(trial)}
                for trial in self.trials]

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow([*(column.name for column in self.columns), "best"])
        for record in self.records():
            writer.writerow([spreadsheet_safe(value) for value in record.values()])
        return out.getvalue()

    def terminal_lines(self) -> list[str]:
        """An aligned table (the best trial's id starred), then each trial's reason for failing or being skipped."""
        columns = [column for column in self.columns if column.terminal]
        lines = [[column.header for column in columns]]
        for row in self._rows(columns):
            texts = [cell.text for cell in row.cells]
            texts[0] = ("*" if row.best else "") + texts[0]
            lines.append(texts)
        widths = [max(len(line[index]) for line in lines) for index in range(len(columns))]
        written = ["  ".join(text.rjust(width) if column.numeric else text.ljust(width)
                             for column, text, width in zip(columns, line, widths, strict=True)).rstrip()
                   for line in lines]
        written.insert(1, "  ".join("-" * width for width in widths))
        for trial in self.trials:
            if trial.reason:
                written.append(f"  trial {trial.id} {trial.status}: {trial.reason}")
        return written


def _remeasured_columns(result: SweepResult) -> tuple[Column, ...]:
    """The throughput column with a finalist's re-measured runs beside its first pass (flagged where they
    contradict it: the first pass outside the re-measured range), and the re-measured median as a CSV column, so
    that no first-pass figure the re-measurement contradicted stands alone."""
    def remeasured(trial):
        repeats = result.remeasured(trial.id)
        return repeats.median if repeats else None

    def cell(trial) -> Cell:
        first = _throughput(trial)
        repeats = result.remeasured(trial.id)
        first_pass = _metric("output_tokens_per_s")(trial)
        if repeats is None or first_pass is None or repeats.min is None:
            return first
        contradicted = not repeats.min <= first_pass <= repeats.max
        return Cell(first.text, note=f"{first.note} first pass; re-measured {repeats.median:.1f} "
                                     f"({repeats.count} runs: {repeats.min:.1f} – {repeats.max:.1f})".strip(),
                    flag=first.flag or contradicted,
                    title="the re-measured runs contradict the first pass: the verdict uses the re-measured runs"
                    if contradicted else first.title)

    columns = tuple(Column(column.name, column.header, column.value, column.unit, column.text, cell=cell,
                           terminal=column.terminal) if column.name == "output_tokens_per_s" else column
                    for column in SWEEP_COLUMNS)
    return (*columns, Column("remeasured_output_tokens_per_s", "re-measured tok/s", remeasured, "tokens/s",
                             _number(".1f"), page=False))


def sweep_table(result: SweepResult) -> TrialTable:
    return TrialTable(_remeasured_columns(result), result.trials, result.best.id if result.best else None)


def serve_sweep_table(result: ServeSweepResult) -> TrialTable:
    return TrialTable(SERVE_SWEEP_COLUMNS, result.trials, result.best.id if result.best else None)


def endpoint_bench_table(result: EndpointBenchResult) -> TrialTable:
    return TrialTable(ENDPOINT_BENCH_COLUMNS, result.trials, result.best.id if result.best else None)
