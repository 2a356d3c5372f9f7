"""Parse the text that GPU interconnect tools print into plain, JSON-ready data.

Handled outputs (``parse_topology`` tells them apart and dispatches):

* ``nvidia-smi topo -m`` (``--matrix``): the device matrix. Two whitespace families occur:

  - *tab-separated*, as nvidia-smi writes it: the header starts with a tab (copies sometimes lose it),
    the self cell is `` X ``, rows carry padding cells (``\\t0\\t\\tN/A``; NIC rows may end ``\\t\\t\\t\\t``);
  - *space-expanded*, copied from a terminal: tabs rendered to 8-column stops, so empty cells vanish
    into runs of spaces.

  Matrix cells never contain spaces, so every row is read as whitespace-separated tokens: the row name,
  then one code per column, then the affinity values. Because empty cells vanish in the space-expanded
  family, the affinity values are matched to the header's affinity columns by count rather than by
  position (see ``_affinity_values``). Columns are ``GPUn`` plus either ``NICn`` (resolved through the
  "NIC Legend" to ``mlx5_*`` names) or, on older drivers, the ``mlx5_N`` names themselves. ANSI
  colour/underline escapes (some terminals underline the header) are removed first.
* ``nvidia-smi nvlink --status`` / ``-s`` (per-GPU link speeds, ``<inactive>`` links, the NVML
  "all links are inActive" line, ``...`` elisions) and ``nvidia-smi nvlink -R`` (remote ends).
* ``rocm-smi --showtopo``: fixed-width tables (weight, hops, link type) under ``=== Title ===``
  banners and the ``Numa Nodes`` lines. Truncated output and the ROCm 6.1 partition-mode bug (link
  types printed under the "Weight" title, ``XXXX`` cells, error lines inside sections) do not raise.
* ``amd-smi topology``: ``NAME TABLE:`` blocks labelled by PCI bus id (ACCESS, WEIGHT, HOPS,
  LINK TYPE, NUMA BW, CACHE COHERANCY, ATOMICS, DMA, BI-DIRECTIONAL), with or without blank lines
  between them.

Matrix-like results share one shape::

    {"tool": str,
     "devices": [{"name", "kind": "gpu" | "nic", "index", ...}],
     "links": [{"a", "b", "kind": "nvlink" | "pcie" | "xgmi" | "unknown", "code", ...}],
     "warnings": [str]}

with one link per unordered device pair (``a`` is the device listed first). NVIDIA results add
``legend`` (code -> nvidia-smi's description). ``parse_nvidia_nvlink_status`` returns
``{"tool", "gpus": [...], "warnings"}`` instead, since that output says nothing about link peers.

Damaged input never raises: what can be read is returned and the rest is described in ``warnings``.
Text that is not the expected tool output at all raises ``ValueError``.

Plain Python on purpose (no Django, no torch): the engine runs this on worker nodes.
"""

from __future__ import annotations

import re
import shutil
import subprocess

# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------

# CSI sequences such as "\x1b[4m" (underline on) and "\x1b[0m" (reset).
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _clean_lines(text: str) -> list[str]:
    """Lines of ``text`` without ANSI escapes or trailing whitespace (leading tabs are kept)."""
    return [_ANSI_ESCAPE.sub("", line).rstrip() for line in text.splitlines()]


def _pick_symmetric(
    matrix: dict[tuple[str, str], str], a: str, b: str, what: str, warnings: list[str]
) -> str | None:
    """The value for the unordered pair (a, b): row a's cell, or row b's when a's is missing.

    A topology matrix is symmetric; when the two halves disagree we keep row a's value and say so.
    """
    forward, backward = matrix.get((a, b)), matrix.get((b, a))
    if forward is not None and backward is not None and forward != backward:
        warnings.append(f"{what} is not symmetric for {a}/{b}: {forward!r} vs {backward!r}; kept {forward!r}")
    return forward if forward is not None else backward


def _int_or_none(value: str | None) -> int | None:
    if value is None or not re.fullmatch(r"-?\d+", value):
        return None
    return int(value)


# ---------------------------------------------------------------------------------------------
# nvidia-smi topo -m
# ---------------------------------------------------------------------------------------------

NVIDIA_TOPO_TOOL = "nvidia-smi topo -m"

# nvidia-smi's own legend (current wording). "NV#" stands for every NV<n> code.
NVIDIA_LINK_LEGEND = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "NV#": "Connection traversing a bonded set of # NVLinks",
}
_PCIE_CODES = ("SYS", "NODE", "PHB", "PXB", "PIX")
_NVLINK_CODE = re.compile(r"NV(\d+)")

# Header names of the per-GPU columns after the matrix, and the device keys they fill.
_AFFINITY_COLUMNS = {"CPU Affinity": "cpu_affinity", "NUMA Affinity": "numa_affinity", "GPU NUMA ID": "gpu_numa_id"}
_AFFINITY_HEADER = re.compile("|".join(re.escape(name) for name in _AFFINITY_COLUMNS))

# A CPU or NUMA-node list as nvidia-smi prints it: "0-47", "0,3-9,11-17".
_ID_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
_GPU_NAME = re.compile(r"GPU(\d+)")
_NIC_NAME = re.compile(r"NIC(\d+)")
# Row labels we accept even when the header has no such column (a mangled header); legacy drivers
# name NIC columns after the RDMA device (mlx5_0, mlx5_bond_0, ...).
_DEVICE_LABEL = re.compile(r"GPU\d+|NIC\d+|mlx\d*_\w+")
# A token that has the form of an affinity value ("0-47", "0,3-9", "2", "N/A"; a cut one: "-31,64-95"),
# as opposed to a matrix cell ("X", "NV18", "PIX", or a mangled one such as "N?4").
_AFFINITY_LIKE = re.compile(r"N/A|[\d,-]+")
_NIC_LEGEND_ENTRY = re.compile(r"\s*(NIC\d+)\s*:\s*(\S+)")


def _link_kind(code: str) -> tuple[str, int | None] | None:
    """("nvlink", n) for NV<n>, ("pcie", None) for the PCIe codes, None for anything else."""
    nvlink = _NVLINK_CODE.fullmatch(code)
    if nvlink:
        return "nvlink", int(nvlink.group(1))
    if code in _PCIE_CODES:
        return "pcie", None
    return None


def _code_description(code: str) -> str:
    nvlink = _NVLINK_CODE.fullmatch(code)
    if nvlink:
        return NVIDIA_LINK_LEGEND["NV#"].replace("#", nvlink.group(1))
    return NVIDIA_LINK_LEGEND[code]


def _is_matrix_header(tokens: list[str]) -> bool:
    # The header names GPU0 and, unlike every row, has no self cell "X".
    return "GPU0" in tokens and "X" not in tokens


def _find_matrix_header(lines: list[str]) -> int | None:
    for number, line in enumerate(lines):
        if _is_matrix_header(line.split()):
            return number
    return None


def _parse_matrix_header(line: str) -> tuple[list[str], list[str]]:
    """(device column names, affinity column names) in header order.

    Affinity names contain spaces, so they are cut out by name first; what is left are device names.
    Whether the line starts with a tab or not does not matter here.
    """
    affinity_names = _AFFINITY_HEADER.findall(line)
    columns = _AFFINITY_HEADER.sub(" ", line).split()
    return columns, affinity_names


def _new_matrix_device(name: str, nic_legend: dict[str, str]) -> dict:
    gpu = _GPU_NAME.fullmatch(name)
    if gpu:
        return {
            "name": name,
            "kind": "gpu",
            "index": int(gpu.group(1)),
            "cpu_affinity": None,
            "numa_affinity": None,
            "gpu_numa_id": None,
        }
    nic = _NIC_NAME.fullmatch(name)
    if nic:
        return {"name": name, "kind": "nic", "index": int(nic.group(1)), "device": nic_legend.get(name)}
    # Legacy drivers: the column is the RDMA device itself (mlx5_0 ...); no NICn number exists.
    return {"name": name, "kind": "nic", "index": None, "device": name}


def _parse_nic_legend(lines: list[str]) -> dict[str, str]:
    legend: dict[str, str] = {}
    in_legend = False
    for line in lines:
        if line.strip() == "NIC Legend:":
            in_legend = True
            continue
        entry = _NIC_LEGEND_ENTRY.fullmatch(line) if in_legend else None
        if entry:
            legend[entry.group(1)] = entry.group(2)
    return legend


def _matrix_rows(lines: list[str], start: int) -> list[str]:
    """The row lines that follow the header: up to the first blank line or the legend."""
    rows = []
    for line in lines[start:]:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        rows.append(line)
    return rows


def _split_matrix_row(tokens: list[str], column_count: int) -> tuple[list[str], list[str]]:
    """(matrix cells, trailing affinity values) of a row's tokens after its label.

    Cells are the leading tokens up to the first affinity-like one, at most one per column. Cutting
    by form rather than by count keeps a short row from swallowing its affinity values, while a
    mangled cell still holds its place (and is reported later as an unrecognised code).
    """
    cells: list[str] = []
    for token in tokens:
        if len(cells) == column_count or _AFFINITY_LIKE.fullmatch(token):
            break
        cells.append(token)
    return cells, tokens[len(cells):]


def _affinity_values(names: list[str], values: list[str], row: str, warnings: list[str]) -> dict[str, str]:
    """Map the values after a GPU row's matrix cells to the header's affinity columns.

    nvidia-smi pads with empty cells and the space-expanded family loses them, so positions are
    unreliable; the count is not. With one value per column they pair up in order. With fewer, the
    missing ones are taken to be at the left: nvidia-smi always prints something ("N/A") for NUMA
    Affinity and GPU NUMA ID, while CPU Affinity is left empty when the caller's cpuset (Slurm,
    cgroups) holds none of the GPU's CPUs.
    """
    if len(values) > len(names):
        warnings.append(f"{row}: {len(values)} values for {len(names)} affinity columns: {values}; kept the first")
        values = values[: len(names)]
    return dict(zip(names[len(names) - len(values):], values, strict=True))


def _affinity_fields(raw: dict[str, str], row: str, warnings: list[str]) -> dict:
    """The device keys cpu_affinity / numa_affinity (id lists as text) and gpu_numa_id (int)."""
    fields: dict = {}
    for header, key in _AFFINITY_COLUMNS.items():
        value = raw.get(header)
        if value is None or value in ("", "N/A"):
            continue
        well_formed = value.isdigit() if key == "gpu_numa_id" else _ID_LIST.fullmatch(value)
        if not well_formed:
            warnings.append(f"{row}: {header} {value!r} is not well formed; left out")
            continue
        fields[key] = int(value) if key == "gpu_numa_id" else value
    return fields


def _read_matrix_row(
    line: str,
    columns: list[str],
    affinity_names: list[str],
    matrix: dict[tuple[str, str], str],
    warnings: list[str],
) -> tuple[str, dict] | None:
    """Record one row's cells in ``matrix``; return (label, affinity fields), or None if not a row."""
    tokens = line.split()
    label = tokens[0]
    if label not in columns and not _DEVICE_LABEL.fullmatch(label):
        warnings.append(f"not a matrix row, skipped: {line.strip()!r}")
        return None
    cells, trailing = _split_matrix_row(tokens[1:], len(columns))
    if len(cells) < len(columns):
        warnings.append(f"{label}: only {len(cells)} of {len(columns)} matrix cells (row truncated or mangled)")
    for column, code in zip(columns, cells, strict=False):
        _record_matrix_cell(label, column, code, matrix, warnings)
    raw_affinity: dict[str, str] = {}
    if trailing and _GPU_NAME.fullmatch(label):
        raw_affinity = _affinity_values(affinity_names, trailing, label, warnings)
    elif trailing:
        warnings.append(f"{label}: unexpected values after the matrix cells: {trailing}")
    return label, _affinity_fields(raw_affinity, label, warnings)


def _record_matrix_cell(
    row: str, column: str, code: str, matrix: dict[tuple[str, str], str], warnings: list[str]
) -> None:
    if row == column:
        if code != "X":
            warnings.append(f"{row}: self cell is {code!r}, expected 'X'")
        return
    if _link_kind(code) is None:
        warnings.append(f"{row}/{column}: unrecognised link code {code!r}")
        return
    matrix[(row, column)] = code


def _matrix_links(names: list[str], matrix: dict[tuple[str, str], str], warnings: list[str]) -> list[dict]:
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            code = _pick_symmetric(matrix, a, b, "matrix", warnings)
            if code is None:
                continue
            kind, nvlinks = _link_kind(code)
            link = {"a": a, "b": b, "kind": kind, "code": code}
            if nvlinks is not None:
                link["nvlinks"] = nvlinks
            links.append(link)
    return links


def parse_nvidia_topo_matrix(text: str) -> dict:
    """Parse ``nvidia-smi topo -m`` output (see the module docstring for the shapes handled).

    Returns ``{"tool", "devices", "links", "legend", "warnings"}``. GPU devices carry ``cpu_affinity``
    and ``numa_affinity`` (id lists as text, e.g. "0-47" or "0,3-9,11-17") and ``gpu_numa_id`` (int);
    each is None when empty, N/A or absent. NIC devices carry ``device`` (the mlx5 name, or None when
    the NIC Legend is missing). Links carry ``kind`` ("nvlink" or "pcie"), the exact ``code`` and, for
    NVLink, ``nvlinks`` (the number of bonded links).
    """
    lines = _clean_lines(text)
    header_at = _find_matrix_header(lines)
    if header_at is None:
        raise ValueError("not nvidia-smi topo -m output: no matrix header naming GPU0 was found")
    warnings: list[str] = []
    columns, affinity_names = _parse_matrix_header(lines[header_at])
    nic_legend = _parse_nic_legend(lines[header_at:])
    devices = {name: _new_matrix_device(name, nic_legend) for name in columns}

    matrix: dict[tuple[str, str], str] = {}
    rows_seen: list[str] = []
    for line in _matrix_rows(lines, header_at + 1):
        row = _read_matrix_row(line, columns, affinity_names, matrix, warnings)
        if row is None:
            continue
        label, affinity = row
        if label in rows_seen:
            warnings.append(f"{label}: duplicate row ignored")
            continue
        rows_seen.append(label)
        device = devices.setdefault(label, _new_matrix_device(label, nic_legend))
        if device["kind"] == "gpu":
            device.update(affinity)

    _warn_about_matrix_shape(columns, rows_seen, devices, warnings)
    names = columns + [name for name in rows_seen if name not in columns]
    links = _matrix_links(names, matrix, warnings)
    legend = {link["code"]: _code_description(link["code"]) for link in links}
    return {
        "tool": NVIDIA_TOPO_TOOL,
        "devices": [devices[name] for name in names],
        "links": links,
        "legend": dict(sorted(legend.items())),
        "warnings": warnings,
    }


def _warn_about_matrix_shape(columns: list[str], rows: list[str], devices: dict, warnings: list[str]) -> None:
    if not rows:
        warnings.append("the matrix header has no rows under it (output truncated?)")
        return
    without_row = [name for name in columns if name not in rows]
    if without_row:
        warnings.append(f"no row for {', '.join(without_row)} (output truncated?)")
    without_column = [name for name in rows if name not in columns]
    if without_column:
        warnings.append(f"rows {', '.join(without_column)} have no column in the header (matrix mangled?)")
    unnamed = [d["name"] for d in devices.values() if d["kind"] == "nic" and d["device"] is None]
    if unnamed:
        warnings.append(f"no NIC Legend entry for {', '.join(unnamed)}")


# ---------------------------------------------------------------------------------------------
# nvidia-smi nvlink --status / -s (and -R)
# ---------------------------------------------------------------------------------------------

_NVLINK_GPU = re.compile(r"GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?")
_NVLINK_SPEED = re.compile(r"Link (\d+): ([\d.]+) GB/s")
_NVLINK_INACTIVE = re.compile(r"Link (\d+): <inactive>")
_NVLINK_REMOTE = re.compile(r"Link (\d+): Remote Device ([0-9A-Fa-f:.]+): Link (\d+)")
_NVLINK_ANY_LINK = re.compile(r"Link \d+:")


def _nvlink_link(line: str) -> dict | None:
    speed = _NVLINK_SPEED.fullmatch(line)
    if speed:
        return {"link": int(speed.group(1)), "active": True, "speed_gb_s": float(speed.group(2))}
    inactive = _NVLINK_INACTIVE.fullmatch(line)
    if inactive:
        return {"link": int(inactive.group(1)), "active": False, "speed_gb_s": None}
    remote = _NVLINK_REMOTE.fullmatch(line)
    if remote:
        return {
            "link": int(remote.group(1)),
            "active": True,
            "remote_pci_bus_id": remote.group(2),
            "remote_link": int(remote.group(3)),
        }
    return None


def _new_nvlink_gpu(header: re.Match) -> dict:
    return {
        "index": int(header.group(1)),
        "name": header.group(2).strip(),
        "uuid": header.group(3),
        "links": [],
        "active_links": 0,
        "all_links_inactive": False,
    }


def parse_nvidia_nvlink_status(text: str) -> dict:
    """Parse ``nvidia-smi nvlink --status`` (``-s``) or ``nvidia-smi nvlink -R`` output.

    Returns ``{"tool", "gpus", "warnings"}``; each GPU is ``{"index", "name", "uuid", "links",
    "active_links", "all_links_inactive"}`` and each link ``{"link", "active", "speed_gb_s"}`` (speed
    None when inactive) or, for ``-R``, ``{"link", "active", "remote_pci_bus_id", "remote_link"}``.
    """
    gpus: list[dict] = []
    warnings: list[str] = []
    for line in (line.strip() for line in _clean_lines(text)):
        header = _NVLINK_GPU.fullmatch(line)
        if header:
            gpus.append(_new_nvlink_gpu(header))
        elif not line:
            continue
        elif line == "..." or line == "…":
            warnings.append("output was elided ('...'): some GPUs are missing")
        elif "all links are inactive" in line.lower():  # NVML spells it "inActive"
            if gpus:
                gpus[-1]["all_links_inactive"] = True
        elif gpus and _NVLINK_ANY_LINK.match(line):
            _add_nvlink_line(gpus[-1], line, warnings)
        else:
            warnings.append(f"unrecognised line: {line!r}")
    if not gpus:
        raise ValueError("not nvidia-smi nvlink output: no 'GPU <n>: <name>' line was found")
    _warn_about_missing_gpus(gpus, warnings)
    remote = any("remote_link" in link for gpu in gpus for link in gpu["links"])
    return {
        "tool": "nvidia-smi nvlink -R" if remote else "nvidia-smi nvlink --status",
        "gpus": gpus,
        "warnings": warnings,
    }


def _add_nvlink_line(gpu: dict, line: str, warnings: list[str]) -> None:
    link = _nvlink_link(line)
    if link is None:
        warnings.append(f"GPU{gpu['index']}: unrecognised link line {line!r}")
        return
    gpu["links"].append(link)
    gpu["active_links"] += link["active"]


def _warn_about_missing_gpus(gpus: list[dict], warnings: list[str]) -> None:
    indices = [gpu["index"] for gpu in gpus]
    missing = sorted(set(range(max(indices) + 1)) - set(indices))
    if missing:
        warnings.append(f"GPUs missing from the output: {', '.join(str(index) for index in missing)}")


# ---------------------------------------------------------------------------------------------
# rocm-smi --showtopo
# ---------------------------------------------------------------------------------------------

ROCM_TOPO_TOOL = "rocm-smi --showtopo"

# "=== Weight between two GPUs ===" and friends; the width of the banner varies between versions.
_ROCM_BANNER = re.compile(r"=+ (.*?) =+")
_ROCM_NUMA = re.compile(r"GPU\[(\d+)\]\s*:\s*\(Topology\) Numa (Node|Affinity):\s*(-?\d+)")
_AMD_LINK_TYPES = {"XGMI": "xgmi", "PCIE": "pcie"}


def _is_gpu_header(tokens: list[str]) -> bool:
    return bool(tokens) and all(_GPU_NAME.fullmatch(token) for token in tokens)


def _rocm_sections(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(banner title, lines under it) in order; lines before the first banner get the title ""."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in lines:
        banner = _ROCM_BANNER.fullmatch(line.strip())
        if banner:
            sections.append((banner.group(1), []))
        else:
            sections[-1][1].append(line)
    return sections


def _read_gpu_table(lines: list[str], start: int, warnings: list[str]) -> tuple[list[str], dict, int]:
    """Read the GPU-labelled table whose header is ``lines[start]``.

    Returns (column names, {(row, column): cell}, index of the first line after the table). Cells
    are whitespace-separated: rocm-smi pads to fixed widths, sometimes with trailing spaces.
    """
    columns = lines[start].split()
    cells: dict[tuple[str, str], str] = {}
    end = start + 1
    while end < len(lines):
        tokens = lines[end].split()
        if not tokens or not _GPU_NAME.fullmatch(tokens[0]):
            break
        row, values = tokens[0], tokens[1:]
        if len(values) != len(columns):
            warnings.append(f"{row}: {len(values)} cells for {len(columns)} columns")
        cells.update({(row, column): value for column, value in zip(columns, values, strict=False)})
        end += 1
    return columns, cells, end


def _rocm_table_role(title: str, cells: dict, warnings: list[str]) -> str:
    """Which table this is ("weight", "hops" or "link_type"), judged by its values as well as its title.

    The values win because a buggy ROCm prints link types under the "Weight" title (the MI300
    partition-mode known issue).
    """
    off_diagonal = [value for (row, column), value in cells.items() if row != column]
    holds_link_types = any(not re.fullmatch(r"-?\d+|N/A", value) for value in off_diagonal)
    by_title = "hops" if "Hops" in title else "link_type" if "Link Type" in title else "weight"
    if holds_link_types and by_title != "link_type":
        warnings.append(f"the table under {title!r} holds link types, not numbers; read as the link type table")
        return "link_type"
    return by_title


def _rocm_tool_message(line: str) -> bool:
    """rocm-smi prints its errors and warnings inline (e.g. "ERROR: GPU[1] : Cannot read Link Weight")."""
    return bool(re.match(r"(ERROR|WARNING)\b|.*[Nn]ot supported", line.strip()))


def _parse_rocm_section(title: str, lines: list[str], tables: dict, numa: dict, warnings: list[str]) -> None:
    number = 0
    while number < len(lines):
        line = lines[number]
        tokens = line.split()
        numa_line = _ROCM_NUMA.fullmatch(line.strip())
        if numa_line:
            numa.setdefault(int(numa_line.group(1)), {})[numa_line.group(2).lower()] = int(numa_line.group(3))
        elif _is_gpu_header(tokens):
            columns, cells, number = _read_gpu_table(lines, number, warnings)
            if not cells:
                warnings.append(f"the {title!r} table has a header but no rows (output truncated?)")
            else:
                tables[_rocm_table_role(title, cells, warnings)] = (columns, cells)
            continue
        elif _rocm_tool_message(line):
            warnings.append(f"rocm-smi: {line.strip()}")
        elif tokens:
            warnings.append(f"unrecognised line under {title!r}: {line.strip()!r}")
        number += 1


def _amd_link(a: str, b: str, tables: dict, warnings: list[str]) -> dict | None:
    """The link a-b from the weight/hops/link-type tables (each maps (row, column) to a cell)."""
    values = {role: _pick_symmetric(cells, a, b, role, warnings) for role, cells in tables.items()}
    if all(value is None for value in values.values()):
        return None
    code = values.get("link_type")
    link = {"a": a, "b": b, "kind": _AMD_LINK_TYPES.get(code, "unknown"), "code": code}
    for role in ("weight", "hops"):
        if _int_or_none(values.get(role)) is not None:
            link[role] = int(values[role])
    return link


def parse_rocm_showtopo(text: str) -> dict:
    """Parse ``rocm-smi --showtopo`` output.

    Returns ``{"tool", "devices", "links", "warnings"}``. Devices are ``{"name": "GPU0", "kind": "gpu",
    "index", "numa_node", "numa_affinity"}`` (NUMA values None when not printed or -1); links are
    ``{"a", "b", "kind": "xgmi" | "pcie" | "unknown", "code"}`` plus ``weight`` and ``hops`` when known.
    """
    lines = _clean_lines(text)
    if not any("ROCm System Management Interface" in line or "between two GPUs" in line for line in lines):
        raise ValueError("not rocm-smi --showtopo output: no 'ROCm System Management Interface' banner was found")
    warnings: list[str] = []
    tables: dict[str, tuple[list[str], dict]] = {}
    numa: dict[int, dict[str, int]] = {}
    for title, section_lines in _rocm_sections(lines):
        _parse_rocm_section(title, section_lines, tables, numa, warnings)
    if not any("End of ROCm SMI Log" in line for line in lines):
        warnings.append("output ends before 'End of ROCm SMI Log' (truncated?)")
    for role in ("weight", "hops", "link_type"):
        if role not in tables:
            warnings.append(f"no {role.replace('_', ' ')} table")
    names = _rocm_device_names(tables, numa)
    devices = [_rocm_device(name, numa) for name in names]
    return {
        "tool": ROCM_TOPO_TOOL,
        "devices": devices,
        "links": _amd_links(names, {role: cells for role, (_, cells) in tables.items()}, warnings),
        "warnings": warnings,
    }


def _rocm_device_names(tables: dict, numa: dict[int, dict]) -> list[str]:
    indices = set(numa)
    for columns, cells in tables.values():
        indices.update(int(_GPU_NAME.fullmatch(name).group(1)) for name in columns)
        indices.update(int(_GPU_NAME.fullmatch(row).group(1)) for row, _ in cells)
    return [f"GPU{index}" for index in sorted(indices)]


def _rocm_device(name: str, numa: dict[int, dict[str, int]]) -> dict:
    index = int(name[3:])
    node = numa.get(index, {}).get("node")
    affinity = numa.get(index, {}).get("affinity")
    return {
        "name": name,
        "kind": "gpu",
        "index": index,
        # -1 is how rocm-smi says "no NUMA node".
        "numa_node": node if node is not None and node >= 0 else None,
        "numa_affinity": str(affinity) if affinity is not None and affinity >= 0 else None,
    }


def _amd_links(names: list[str], tables: dict, warnings: list[str]) -> list[dict]:
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            link = _amd_link(a, b, tables, warnings)
            if link is not None:
                links.append(link)
    unknown = sorted({link["code"] for link in links if link["kind"] == "unknown" and link["code"]})
    if unknown:
        warnings.append(f"links with unrecognised link type codes: {', '.join(unknown)} (kind 'unknown')")
    return links


# ---------------------------------------------------------------------------------------------
# amd-smi topology
# ---------------------------------------------------------------------------------------------

AMD_SMI_TOPO_TOOL = "amd-smi topology"

_AMD_SMI_TABLE_TITLE = re.compile(r"([A-Z][A-Z -]*?) TABLE:")
_PCI_BUS_ID = re.compile(r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]")

# amd-smi table title -> how one of its cells becomes a link key (None: leave the key out).
_TRUE_FALSE = {"T": True, "F": False}
_AMD_SMI_CELLS = {
    "ACCESS": ("accessible", lambda cell: {"ENABLED": True, "DISABLED": False}.get(cell)),
    "WEIGHT": ("weight", _int_or_none),
    "HOPS": ("hops", _int_or_none),
    "NUMA BW": ("numa_bw", lambda cell: cell if re.fullmatch(r"\d+-\d+", cell) else None),
    "CACHE COHERANCY": ("coherent", lambda cell: {"C": True, "NC": False}.get(cell)),
    "ATOMICS": ("atomics", lambda cell: cell if re.fullmatch(r"\d+(,\d+)*", cell) else None),
    "DMA": ("dma", _TRUE_FALSE.get),
    "BI-DIRECTIONAL": ("bidirectional", _TRUE_FALSE.get),
}


def _read_amd_smi_tables(lines: list[str], warnings: list[str]) -> tuple[list[str], dict[str, dict]]:
    """(device bus ids in column order, {table title: {(row, column): cell}}).

    Tables follow ``NAME TABLE:`` lines, with or without blank lines between them (it varies by
    version); a table ends at the first line that is not a bus-id row.
    """
    bus_ids: list[str] = []
    tables: dict[str, dict] = {}
    title, columns = None, []
    for line in lines:
        tokens = line.split()
        heading = _AMD_SMI_TABLE_TITLE.fullmatch(line.strip())
        if heading:
            title, columns = heading.group(1), []
            tables[title] = {}
        elif title and tokens and all(_PCI_BUS_ID.fullmatch(token) for token in tokens):
            columns = tokens
            bus_ids.extend(bus_id for bus_id in columns if bus_id not in bus_ids)
        elif title and len(tokens) > 1 and _PCI_BUS_ID.fullmatch(tokens[0]):
            if len(tokens) - 1 != len(columns):
                warnings.append(f"{title} TABLE, {tokens[0]}: {len(tokens) - 1} cells for {len(columns)} columns")
            tables[title].update({(tokens[0], column): cell for column, cell in zip(columns, tokens[1:], strict=False)})
        else:
            title = None  # the table (if any) has ended: blank line, legend, anything else
    return bus_ids, tables


def _amd_smi_link(a: str, b: str, tables: dict[str, dict], warnings: list[str]) -> dict | None:
    link: dict = {"a": a, "b": b, "kind": "unknown", "code": None}
    found = False
    for title, cells in tables.items():
        cell = _pick_symmetric(cells, a, b, f"{title} TABLE", warnings)
        if cell is None:
            continue
        found = True
        if title == "LINK TYPE":
            link["kind"], link["code"] = _AMD_LINK_TYPES.get(cell, "unknown"), cell
        elif title in _AMD_SMI_CELLS:
            key, convert = _AMD_SMI_CELLS[title]
            if convert(cell) is not None:
                link[key] = convert(cell)
    return link if found else None


def parse_amd_smi_topology(text: str) -> dict:
    """Parse ``amd-smi topology`` output (any subset of its tables, e.g. from ``-cndz``).

    Returns ``{"tool", "devices", "links", "warnings"}``. Devices are ``{"name": "GPU<i>", "kind": "gpu",
    "index", "bdf"}`` with ``i`` the table order (amd-smi lists GPUs by index). Links carry ``kind``
    ("xgmi", "pcie", or "unknown" without a LINK TYPE table) and ``code``, plus whatever the tables
    give: ``weight``, ``hops`` (ints), ``accessible``, ``coherent``, ``dma``, ``bidirectional`` (bools),
    ``numa_bw`` ("min-max" text) and ``atomics`` ("64,32"). N/A cells are left out.
    """
    lines = _clean_lines(text)
    warnings: list[str] = []
    bus_ids, tables = _read_amd_smi_tables(lines, warnings)
    if not bus_ids:
        raise ValueError("not amd-smi topology output: no 'NAME TABLE:' heading followed by PCI bus ids")
    names = {bus_id: f"GPU{index}" for index, bus_id in enumerate(bus_ids)}
    devices = [{"name": names[bus_id], "kind": "gpu", "index": i, "bdf": bus_id} for i, bus_id in enumerate(bus_ids)]
    unknown_tables = sorted(set(tables) - set(_AMD_SMI_CELLS) - {"LINK TYPE"})
    if unknown_tables:
        warnings.append(f"tables not interpreted: {', '.join(unknown_tables)}")
    links = []
    for i, a in enumerate(bus_ids):
        for b in bus_ids[i + 1:]:
            link = _amd_smi_link(a, b, tables, warnings)
            if link is not None:
                link["a"], link["b"] = names[a], names[b]
                links.append(link)
    return {"tool": AMD_SMI_TOPO_TOOL, "devices": devices, "links": links, "warnings": warnings}


# ---------------------------------------------------------------------------------------------
# Detection, dispatch and collection
# ---------------------------------------------------------------------------------------------


def _detect_tool(lines: list[str]) -> str | None:
    if any(_AMD_SMI_TABLE_TITLE.fullmatch(line.strip()) for line in lines):
        return AMD_SMI_TOPO_TOOL
    if any("ROCm System Management Interface" in line or "between two GPUs" in line for line in lines):
        return ROCM_TOPO_TOOL
    if _find_matrix_header(lines) is not None:
        return NVIDIA_TOPO_TOOL
    # "GPU <n>: <name> (UUID: ...)" alone is also what nvidia-smi -L prints; nvlink output has link lines.
    has_gpu_lines = any(_NVLINK_GPU.fullmatch(line.strip()) for line in lines)
    if has_gpu_lines and any(_NVLINK_ANY_LINK.match(line.strip()) or "NVLink" in line for line in lines):
        return "nvidia-smi nvlink"
    return None


_PARSERS = {
    AMD_SMI_TOPO_TOOL: parse_amd_smi_topology,
    ROCM_TOPO_TOOL: parse_rocm_showtopo,
    NVIDIA_TOPO_TOOL: parse_nvidia_topo_matrix,
    "nvidia-smi nvlink": parse_nvidia_nvlink_status,
}


def parse_topology(text: str) -> dict:
    """Recognise which tool printed ``text`` and parse it; the result's ``tool`` key says which."""
    tool = _detect_tool(_clean_lines(text))
    if tool is None:
        raise ValueError(
            "unrecognised topology output: expected nvidia-smi topo -m, nvidia-smi nvlink --status, "
            "rocm-smi --showtopo or amd-smi topology"
        )
    return _PARSERS[tool](text)


# Tried in order; the first tool found on PATH is the one used.
_COLLECTORS = (
    ("nvidia-smi", ["topo", "-m"], parse_nvidia_topo_matrix),
    ("rocm-smi", ["--showtopo"], parse_rocm_showtopo),
    ("amd-smi", ["topology"], parse_amd_smi_topology),
)


def collect_topology(timeout: float = 20) -> dict | None:
    """Run the first topology tool found on PATH and parse its output.

    None when no tool is installed. Never raises: a failure (timeout, non-zero exit with nothing
    parseable, unparseable output) is returned as ``{"error": str, "tool": str}``.
    """
    for program, arguments, parse in _COLLECTORS:
        path = shutil.which(program)
        if path is None:
            continue
        command = " ".join([program, *arguments])
        try:
            return _run_and_parse(path, arguments, parse, timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"{command} did not finish within {timeout} s", "tool": command}
        except Exception as error:  # a probe reports failures, it must not crash the worker
            return {"error": f"{command} failed: {error}", "tool": command}
    return None


def _run_and_parse(path: str, arguments: list[str], parse, timeout: float) -> dict:
    completed = subprocess.run(
        [path, *arguments], capture_output=True, text=True, errors="replace", timeout=timeout, check=False
    )
    if completed.returncode != 0 and not completed.stdout.strip():
        detail = (completed.stderr.strip() or "no output").splitlines()[-1]
        raise RuntimeError(f"exit status {completed.returncode}: {detail}")
    result = parse(completed.stdout)
    if completed.returncode != 0:
        # rocm-smi exits non-zero when one query is unsupported yet still prints the rest.
        result["warnings"].append(f"exited with status {completed.returncode}")
    return result
