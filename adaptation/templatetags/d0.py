import json
from html import escape

from django import forms, template
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.timezone import get_current_timezone, localtime

from ..choices import JobStatus

register = template.Library()


@register.simple_tag
def status_badge(status, label) -> str:
    """A coloured status label (d0.css colours ``status-<status>``): a tag rather than an included template, whose
    context and lookup cost more than the label itself in a table's every row."""
    return format_html('<span class="status status-{}">{}</span>', status, label)


_MARKER_ID = 918273645


def _url_of(name: str):
    """``reverse(name, args=[pk])`` for a table's every row at the cost of one: the URL is reversed once with a
    marker id, which each row's id replaces (a reverse per row was a third of a job table's CPU)."""
    head, _, tail = reverse(name, args=[_MARKER_ID]).partition(str(_MARKER_ID))
    return lambda pk: f"{head}{int(pk)}{tail}"


@register.simple_tag
def job_table_rows(jobs, empty) -> str:
    """The rows of a job table (templates/adaptation/jobs/_table.html) from ``job_table_rows()``'s values, written in
    one pass: through the template language (a url tag, a date filter, a badge per row) and Django's escaping they
    took 2-3 ms of the job list's page and of the dashboard."""
    url = _url_of("job-detail")
    badges = {status: status_badge(status, label) for status, label in JobStatus.choices}
    zone = get_current_timezone()  # once per table: looked up per row, it cost more than writing the date
    rows = "\n".join(
        f'<tr><td><a href="{url(job["pk"])}">#{job["pk"]}</a></td>'
        f'<td>{escape(", ".join(job["stages"]))}</td><td>{escape(job["cluster_name"])}</td>'
        f'<td>{escape(job["model_name"] or "—")}</td><td>{badges[job["status"]]}</td>'
        # A number as HTML reads it (a locale's decimal comma would not be one).
        f'<td><progress max="1" value="{float(job["progress"])!r}"></progress></td>'
        # The date filter's "Y-m-d H:i:s T", at a tenth of its cost.
        f'<td>{localtime(job["created"], zone).strftime("%Y-%m-%d %H:%M:%S %Z")}</td>'
        f'<td>{escape(job["submitted_by_name"] or "—")}</td></tr>'
        for job in jobs)
    return mark_safe(rows) if rows else format_html('<tr><td colspan="8" class="empty">{}</td></tr>', empty)


@register.simple_tag
def model_table_rows(models) -> str:
    """The rows of the model list (templates/adaptation/intake/model_list.html) from ``model_table_rows()``'s values,
    written in one pass like ``job_table_rows``: through the template language they were 60% of the page's CPU."""
    rows = []
    detail, coverage_of = _url_of("model-detail"), _url_of("model-coverage")
    zone = get_current_timezone()
    for spec in models:
        coverage = "—"
        if spec["latest_coverage"] is not None:  # the widthratio tag's rounding
            coverage = f'<a href="{coverage_of(spec["pk"])}">{round(float(spec["latest_coverage"]) * 100)}%</a>'
        rows.append(
            f'<tr><td><a href="{detail(spec["pk"])}">{escape(spec["name"])}</a></td>'
            f'<td>{escape(spec["architecture"] or "—")}</td>'
            f'<td>{billions(spec["total_params"])}</td><td>{billions(spec["active_params"])}</td>'
            f'<td>{escape(spec["shipped_quantization"] or spec["shipped_dtype"] or "—")}</td><td>{coverage}</td>'
            f'<td>{escape(spec["team_name"])}</td><td>{escape(spec["created_by_name"] or "—")}</td>'
            f'<td>{localtime(spec["created"], zone).strftime("%Y-%m-%d %H:%M %Z")}</td></tr>')
    return mark_safe("\n".join(rows)) if rows else mark_safe(
        '<tr><td colspan="9" class="empty">No models yet: upload a released config.json.</td></tr>')


@register.simple_tag
def filter_form_fields(form) -> str:
    """A list page's filter form, written in one pass: ``form.as_div`` renders each field, label, error list and
    checkbox through its own template, 40% of the job list's CPU at 10,000 jobs. Same markup as ``as_div`` (a group
    of checkboxes in a fieldset with its legend); selects and text inputs come from their widgets (RowSelect writes
    its options in one pass)."""
    parts = [_error_list(form.non_field_errors())]
    for field in form:
        label, errors = escape(str(field.label)), _error_list(field.errors, f"{field.auto_id}_error")
        if isinstance(field.field.widget, forms.CheckboxSelectMultiple):
            chosen = {str(value) for value in (field.value() or [])}
            name, base = escape(field.html_name), escape(field.auto_id)
            boxes = "".join(
                f'<div><label for="{base}_{index}"><input type="checkbox" name="{name}" value="{escape(str(value))}" '
                f'id="{base}_{index}"{" checked" if str(value) in chosen else ""}> {escape(str(text))}</label></div>'
                for index, (value, text) in enumerate(field.field.choices))
            parts.append(f'<fieldset><legend>{label}:</legend>{errors}<div id="{base}">{boxes}</div></fieldset>')
        else:
            parts.append(f'<div><label for="{escape(field.id_for_label)}">{label}:</label>{errors}'
                         f"{field.as_widget()}</div>")
    return mark_safe("".join(parts))


def _error_list(errors, error_id: str = "") -> str:
    """Django's error list; ``error_id`` is the id the field's widget names in its aria-describedby."""
    if not errors:
        return ""
    element_id = f' id="{escape(error_id)}"' if error_id else ""
    return f'<ul class="errorlist"{element_id}>{"".join(f"<li>{escape(str(error))}</li>" for error in errors)}</ul>'


@register.filter
def as_json(value) -> str:
    """Indented JSON for <pre> blocks (Python's repr would show True/None and single quotes)."""
    return json.dumps(value, indent=2, sort_keys=True)


@register.filter
def billions(value) -> str:
    """A parameter count as people write it, never in exponent form: 1.03 T, 671 B, 5.14 B, 2.1 M, 1,536 ("—" when
    unknown)."""
    if value in (None, ""):
        return "—"
    value = float(value)
    # Three significant digits, but a unit up before .3g would write 999.6 as "1e+03".
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if value >= scale * 0.9995:
            return f"{value / scale:.3g} {unit}"
    return f"{value:,.0f}"


@register.filter
def grouped(value) -> str:
    """An integer with thousands separators: 1,525,914."""
    if value in (None, ""):
        return "—"
    return f"{int(value):,}"


@register.filter
def gib(value) -> str:
    """Bytes as GiB, the unit device memory is sold in (and torch reports)."""
    if value in (None, ""):
        return "—"
    return f"{value / 2**30:,.1f} GiB"


@register.filter
def gbps(value) -> str:
    if value in (None, ""):
        return "—"
    return f"{value / 1e9:,.0f} GB/s"


@register.filter
def get(mapping, key):
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def humanize_key(value: str) -> str:
    return str(value).replace("_", " ")


@register.filter
def timeuntil_seconds(finished, started) -> str:
    """Seconds between two datetimes, for stage durations in reports."""
    return f"{(finished - started).total_seconds():.1f}"


@register.filter
def flops(value) -> str:
    if value in (None, ""):
        return "—"
    return f"{value / 1e9:,.1f} GFLOP/s" if value < 1e12 else f"{value / 1e12:,.1f} TFLOP/s"
