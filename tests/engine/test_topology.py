"""Topology parsing against real tool output (tests/data/topology/, provenance in its INDEX.md).

Plain functions on text: no database, no Django, no GPU.
"""

import json
import stat
from collections import Counter
from pathlib import Path

import pytest

from workers.engine.envcheck.topology import (
    NVIDIA_LINK_LEGEND,
    collect_topology,
    parse_amd_smi_topology,
    parse_nvidia_nvlink_status,
    parse_nvidia_topo_matrix,
    parse_rocm_showtopo,
    parse_topology,
)

SAMPLES = Path(__file__).parent / "data" / "topology"
ALL_SAMPLES = sorted(path.name for path in SAMPLES.glob("*.txt"))


def sample(name: str) -> str:
    return (SAMPLES / name).read_text(encoding="utf-8")


def device(result: dict, name: str) -> dict:
    return next(d for d in result["devices"] if d["name"] == name)


def link(result: dict, a: str, b: str) -> dict:
    return next(x for x in result["links"] if {x["a"], x["b"]} == {a, b})


def links_between(result: dict, kind_a: str, kind_b: str) -> list[dict]:
    kinds = {d["name"]: d["kind"] for d in result["devices"]}
    return [x for x in result["links"] if sorted((kinds[x["a"]], kinds[x["b"]])) == sorted((kind_a, kind_b))]


def codes(links: list[dict]) -> Counter:
    return Counter(x["code"] for x in links)


# --- nvidia-smi topo -m: NVLink meshes --------------------------------------------------------


def test_an_hgx_h100_matrix_gives_a_full_nv18_mesh():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xh100-nv18-12nic-gpunumaid-xd670.txt"))
    gpu_links = links_between(result, "gpu", "gpu")
    assert len(gpu_links) == 28
    assert all(x["kind"] == "nvlink" and x["code"] == "NV18" and x["nvlinks"] == 18 for x in gpu_links)
    assert result["warnings"] == []


def test_the_xd670_matrix_has_one_pix_nic_per_gpu_and_every_pair_once():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xh100-nv18-12nic-gpunumaid-xd670.txt"))
    assert Counter(d["kind"] for d in result["devices"]) == {"gpu": 8, "nic": 12}
    assert len(result["links"]) == 20 * 19 // 2
    assert codes(links_between(result, "gpu", "nic")) == {"PIX": 8, "PXB": 8, "NODE": 32, "SYS": 48}
    assert link(result, "GPU0", "NIC0")["code"] == "PIX"
    assert link(result, "GPU0", "NIC1")["code"] == "PXB"
    assert link(result, "GPU7", "NIC9") == {"a": "GPU7", "b": "NIC9", "kind": "pcie", "code": "PIX"}
    assert link(result, "NIC10", "NIC11")["code"] == "PIX"


def test_a_header_without_its_leading_tab_still_gives_gpu_affinities():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xh100-nv18-12nic-gpunumaid-xd670.txt"))
    assert device(result, "GPU0") == {
        "name": "GPU0",
        "kind": "gpu",
        "index": 0,
        "cpu_affinity": "0-55,112-167",
        "numa_affinity": "0",
        "gpu_numa_id": None,
    }
    assert device(result, "GPU4")["cpu_affinity"] == "56-111,168-223"
    assert device(result, "GPU4")["numa_affinity"] == "1"


def test_nic_rows_with_trailing_empty_cells_become_nics_named_by_the_nic_legend():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xh100-nv18-12nic-gpunumaid-xd670.txt"))
    assert device(result, "NIC11") == {"name": "NIC11", "kind": "nic", "index": 11, "device": "mlx5_11"}


def test_a_nic_legend_that_starts_at_mlx5_1_is_followed_as_printed():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xh20-nv18-8nic-gpunumaid.txt"))
    assert device(result, "NIC0")["device"] == "mlx5_1"
    assert device(result, "NIC7")["device"] == "mlx5_8"
    assert all(link(result, f"GPU{i}", f"NIC{i}")["code"] == "PIX" for i in range(8))
    assert codes(links_between(result, "gpu", "gpu")) == {"NV18": 28}
    assert result["warnings"] == []


def test_a_dgx_a100_with_legacy_mlx5_columns_gives_nv12_and_nics_named_mlx5():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xa100-dgx-nv12-12mlx5-legacy.txt"))
    assert codes(links_between(result, "gpu", "gpu")) == {"NV12": 28}
    nics = [d for d in result["devices"] if d["kind"] == "nic"]
    assert [d["name"] for d in nics] == [f"mlx5_{i}" for i in range(12)]
    assert nics[0] == {"name": "mlx5_0", "kind": "nic", "index": None, "device": "mlx5_0"}
    assert codes(links_between(result, "gpu", "nic")) == {"PXB": 16, "SYS": 80}
    assert link(result, "GPU6", "mlx5_9")["code"] == "PXB"
    assert link(result, "mlx5_4", "mlx5_5")["code"] == "PIX"
    assert result["warnings"] == []


def test_dgx_a100_in_nps4_mode_reports_numa_nodes_1_3_5_7_and_no_gpu_numa_id():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xa100-dgx-nv12-12mlx5-legacy.txt"))
    gpus = [d for d in result["devices"] if d["kind"] == "gpu"]
    assert [g["numa_affinity"] for g in gpus] == ["3", "3", "1", "1", "7", "7", "5", "5"]
    assert gpus[4]["cpu_affinity"] == "112-127,240-255"
    assert all(g["gpu_numa_id"] is None for g in gpus)


def test_seventeen_nics_with_a_bonded_port_resolve_to_mlx5_bond_0():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xa100-nv12-17nic-bond.txt"))
    assert Counter(d["kind"] for d in result["devices"]) == {"gpu": 8, "nic": 17}
    assert device(result, "NIC16")["device"] == "mlx5_bond_0"
    assert {link(result, f"GPU{i}", "NIC16")["code"] for i in range(8)} == {"SYS"}
    assert codes(links_between(result, "gpu", "gpu")) == {"NV12": 28}
    assert codes(links_between(result, "gpu", "nic")) == {"PXB": 32, "SYS": 104}
    assert len(result["links"]) == 25 * 24 // 2
    assert result["warnings"] == []


def test_a_dgx1_hybrid_cube_mesh_keeps_nv1_and_nv2_and_the_column_order_of_its_hcas():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xv100-dgx1-hybridcube-4mlx5-legacy.txt"))
    assert codes(links_between(result, "gpu", "gpu")) == {"NV1": 8, "NV2": 8, "SYS": 12}
    assert link(result, "GPU0", "GPU3") == {"a": "GPU0", "b": "GPU3", "kind": "nvlink", "code": "NV2", "nvlinks": 2}
    assert [d["name"] for d in result["devices"][8:]] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]
    assert link(result, "GPU0", "mlx5_0")["code"] == "PIX"
    assert link(result, "GPU0", "mlx5_1")["code"] == "PHB"
    assert device(result, "GPU4")["cpu_affinity"] == "20-39,60-79"
    assert device(result, "GPU4")["numa_affinity"] is None  # that driver had no NUMA Affinity column
    assert result["warnings"] == []


def test_gb200_reports_numeric_gpu_numa_ids_and_multi_range_numa_affinity():
    result = parse_nvidia_topo_matrix(sample("nvidia-4xgb200-nv18-8nic-gpunumaid-numeric.txt"))
    gpus = [d for d in result["devices"] if d["kind"] == "gpu"]
    assert [g["gpu_numa_id"] for g in gpus] == [2, 10, 18, 26]
    assert [g["numa_affinity"] for g in gpus] == ["0,3-9,11-17"] * 2 + ["1,19-25,27-33"] * 2
    assert [g["cpu_affinity"] for g in gpus] == ["0-71", "0-71", "72-143", "72-143"]
    assert codes(links_between(result, "gpu", "gpu")) == {"NV18": 6}
    assert codes(links_between(result, "gpu", "nic")) == {"SYS": 32}
    assert result["warnings"] == []


# --- nvidia-smi topo -m: NVLink bridges and PCIe-only boxes ----------------------------------


@pytest.mark.parametrize(
    ("name", "code", "nvlinks"),
    [
        ("nvidia-2x3090-nv4-bridge-gpunumaid.txt", "NV4", 4),
        ("nvidia-2xh100pcie-nv12-bridge-gpunumaid.txt", "NV12", 12),
    ],
)
def test_two_gpus_on_an_nvlink_bridge_give_one_nvlink(name, code, nvlinks):
    result = parse_nvidia_topo_matrix(sample(name))
    assert result["links"] == [{"a": "GPU0", "b": "GPU1", "kind": "nvlink", "code": code, "nvlinks": nvlinks}]
    assert result["legend"] == {code: f"Connection traversing a bonded set of {nvlinks} NVLinks"}
    assert result["warnings"] == []


def test_an_ansi_underlined_header_gives_a_bridged_pair_and_a_node_attached_third_gpu():
    result = parse_nvidia_topo_matrix(sample("nvidia-3xrtxa6000-nv4-bridge-ansi-header.txt"))
    assert [d["name"] for d in result["devices"]] == ["GPU0", "GPU1", "GPU2"]
    assert link(result, "GPU0", "GPU1")["code"] == "NV4"
    assert link(result, "GPU0", "GPU2")["code"] == link(result, "GPU1", "GPU2")["code"] == "NODE"
    assert device(result, "GPU2")["numa_affinity"] == "0"
    assert device(result, "GPU2")["cpu_affinity"] == "0-31,64-95"
    assert result["warnings"] == []


@pytest.mark.parametrize(
    ("name", "gpu_gpu_codes"),
    [
        ("nvidia-8x4090-pcie-sys-2nic-gpunumaid.txt", {"SYS": 28}),
        ("nvidia-4xa10-pcie-sys-2nic.txt", {"SYS": 6}),
        ("nvidia-4xl40s-pcie-node-sys-2nic.txt", {"NODE": 2, "SYS": 4}),
        ("nvidia-4xrtx6000ada-pcie-4nic-mlx5.txt", {"NODE": 2, "SYS": 4}),
        ("nvidia-2xrtx6000ada-pcie-phb-2nic.txt", {"PHB": 1}),
        ("nvidia-5xconsumer-pcie-sys-phb-node-asym-numa.txt", {"SYS": 4, "PHB": 2, "NODE": 4}),
        ("nvidia-2x1080ti-pcie-phb-legacy.txt", {"PHB": 1}),
    ],
)
def test_pcie_only_boxes_have_no_nvlink_and_the_expected_pcie_codes(name, gpu_gpu_codes):
    result = parse_nvidia_topo_matrix(sample(name))
    assert codes(links_between(result, "gpu", "gpu")) == gpu_gpu_codes
    assert all(x["kind"] == "pcie" and "nvlinks" not in x for x in result["links"])
    assert set(result["legend"]) == set(codes(result["links"]))


def test_the_4090_box_has_both_nics_under_gpu6_but_no_nic_legend():
    result = parse_nvidia_topo_matrix(sample("nvidia-8x4090-pcie-sys-2nic-gpunumaid.txt"))
    assert link(result, "GPU6", "NIC0")["code"] == link(result, "GPU6", "NIC1")["code"] == "PHB"
    assert codes(links_between(result, "gpu", "nic")) == {"PHB": 2, "SYS": 14}
    assert link(result, "NIC0", "NIC1")["code"] == "PIX"
    assert device(result, "NIC0")["device"] is None
    assert result["warnings"] == ["no NIC Legend entry for NIC0, NIC1"]


def test_l40s_gpus_on_the_second_socket_report_numa_1_and_their_cpu_list():
    result = parse_nvidia_topo_matrix(sample("nvidia-4xl40s-pcie-node-sys-2nic.txt"))
    assert device(result, "GPU2")["cpu_affinity"] == "96-191,288-383"
    assert device(result, "GPU2")["numa_affinity"] == "1"
    assert codes(links_between(result, "gpu", "nic")) == {"NODE": 4, "SYS": 4}
    assert device(result, "NIC1")["device"] == "mlx5_1"
    assert result["warnings"] == []


def test_an_asymmetric_numa_workstation_puts_gpu0_alone_on_node_1():
    result = parse_nvidia_topo_matrix(sample("nvidia-5xconsumer-pcie-sys-phb-node-asym-numa.txt"))
    gpus = result["devices"]
    assert [g["numa_affinity"] for g in gpus] == ["1", "0", "0", "0", "0"]
    assert gpus[0]["cpu_affinity"] == "8-15,24-31"
    assert link(result, "GPU1", "GPU2")["code"] == link(result, "GPU3", "GPU4")["code"] == "PHB"


def test_a_legacy_na_numa_affinity_becomes_none():
    result = parse_nvidia_topo_matrix(sample("nvidia-2x1080ti-pcie-phb-legacy.txt"))
    assert device(result, "GPU1") == {
        "name": "GPU1",
        "kind": "gpu",
        "index": 1,
        "cpu_affinity": "0-11",
        "numa_affinity": None,
        "gpu_numa_id": None,
    }


TAB_SEPARATED_MATRICES = [
    "nvidia-8xh100-nv18-12nic-gpunumaid-xd670.txt",
    "nvidia-8xh20-nv18-8nic-gpunumaid.txt",
    "nvidia-8xa100-dgx-nv12-12mlx5-legacy.txt",
    "nvidia-8xv100-dgx1-hybridcube-4mlx5-legacy.txt",
    "nvidia-8x4090-pcie-sys-2nic-gpunumaid.txt",
    "nvidia-2x3090-nv4-bridge-gpunumaid.txt",
    "nvidia-3xrtxa6000-nv4-bridge-ansi-header.txt",
]


@pytest.mark.parametrize("name", TAB_SEPARATED_MATRICES)
def test_a_space_expanded_copy_parses_exactly_like_the_tab_separated_original(name):
    text = sample(name)
    assert "\t" in text
    assert parse_nvidia_topo_matrix(text.expandtabs(8)) == parse_nvidia_topo_matrix(text)


def test_windows_line_endings_do_not_change_the_result():
    text = sample("nvidia-4xl40s-pcie-node-sys-2nic.txt")
    assert parse_nvidia_topo_matrix(text.replace("\n", "\r\n")) == parse_nvidia_topo_matrix(text)


def test_the_legend_describes_each_code_in_nvidia_smi_wording():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xh100-nv18-12nic-gpunumaid-xd670.txt"))
    assert set(result["legend"]) == {"NV18", "PIX", "PXB", "NODE", "SYS"}
    assert result["legend"]["PIX"] == "Connection traversing at most a single PCIe bridge"
    assert result["legend"]["SYS"] == NVIDIA_LINK_LEGEND["SYS"]
    assert result["legend"]["NV18"] == "Connection traversing a bonded set of 18 NVLinks"


def test_a_single_gpu_matrix_gives_one_device_and_no_links():
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-15\t0\t\tN/A\n"
    result = parse_nvidia_topo_matrix(text)
    assert result["devices"] == [
        {"name": "GPU0", "kind": "gpu", "index": 0, "cpu_affinity": "0-15", "numa_affinity": "0", "gpu_numa_id": None}
    ]
    assert result["links"] == []
    assert result["warnings"] == []


# --- nvidia-smi topo -m: damaged input --------------------------------------------------------


def test_a_truncated_matrix_keeps_its_gpu_links_and_says_the_nic_row_is_missing():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xa100pcie-nv12pairs-empty-cpuaffinity-TRUNCATED.txt"))
    nvlinks = [(x["a"], x["b"]) for x in result["links"] if x["kind"] == "nvlink"]
    assert nvlinks == [("GPU0", "GPU1"), ("GPU2", "GPU3"), ("GPU4", "GPU5"), ("GPU6", "GPU7")]
    assert link(result, "GPU6", "NIC0")["code"] == "PHB"  # taken from GPU6's row, NIC0's row is gone
    assert codes(links_between(result, "gpu", "nic")) == {"NODE": 7, "PHB": 1}
    assert "no row for NIC0 (output truncated?)" in result["warnings"]


def test_an_empty_cpu_affinity_cell_under_slurm_leaves_numa_affinity_in_place():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xa100pcie-nv12pairs-empty-cpuaffinity-TRUNCATED.txt"))
    assert device(result, "GPU3")["cpu_affinity"] == "0-15,56-71"
    assert device(result, "GPU3")["numa_affinity"] == "0"
    for name in ("GPU4", "GPU5", "GPU6", "GPU7"):
        assert device(result, name)["cpu_affinity"] is None
        assert device(result, name)["numa_affinity"] == "1"
        assert device(result, name)["gpu_numa_id"] is None


def test_a_mangled_matrix_does_not_raise_and_lists_what_it_could_not_read():
    result = parse_nvidia_topo_matrix(sample("nvidia-8xh800-nv8-4nic-MANGLED.txt"))
    assert codes(links_between(result, "gpu", "gpu")) == {"NV8": 28}
    # The header lost its NIC columns but the NIC rows survive, so GPU<->NIC links come from them.
    assert device(result, "NIC0") == {"name": "NIC0", "kind": "nic", "index": 0, "device": "mlx5_0"}
    assert device(result, "NIC3")["device"] == "mlx5_3"  # the legend line has trailing spaces
    assert link(result, "GPU1", "NIC0")["code"] == "PIX"
    assert codes(links_between(result, "gpu", "nic")) == {"PIX": 4, "NODE": 12, "SYS": 16}
    # The cut CPU lists ("-31,64-95") are left out and reported; the intact ones are kept.
    assert [device(result, f"GPU{i}")["cpu_affinity"] for i in (0, 3, 4)] == [None, None, "32-63,96-127"]
    assert device(result, "GPU0")["numa_affinity"] == "0"
    assert "GPU0: CPU Affinity '-31,64-95' is not well formed; left out" in result["warnings"]
    assert "rows NIC0, NIC1, NIC2, NIC3 have no column in the header (matrix mangled?)" in result["warnings"]
    assert len(result["warnings"]) == 5


def test_a_row_cut_off_mid_way_keeps_the_cells_it_has():
    text = sample("nvidia-4xl40s-pcie-node-sys-2nic.txt")
    cut = text[: text.index("GPU3    SYS     SYS") + len("GPU3    SYS     SYS")]
    result = parse_nvidia_topo_matrix(cut)
    assert link(result, "GPU3", "GPU0")["code"] == "SYS"
    assert link(result, "GPU2", "GPU3")["code"] == "NODE"  # from GPU2's complete row
    assert device(result, "GPU3")["cpu_affinity"] is None
    assert "GPU3: only 2 of 6 matrix cells (row truncated or mangled)" in result["warnings"]
    assert "no row for NIC0, NIC1 (output truncated?)" in result["warnings"]


def test_gpu_rows_missing_their_nic_cells_keep_their_affinity_values():
    text = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\t X \t0-7\t0\n"
    result = parse_nvidia_topo_matrix(text)
    assert device(result, "GPU1")["cpu_affinity"] == "0-7"
    assert device(result, "GPU1")["numa_affinity"] == "0"
    assert link(result, "GPU0", "GPU1")["code"] == "NV4"
    assert "GPU1: only 2 of 3 matrix cells (row truncated or mangled)" in result["warnings"]


def test_an_unrecognised_cell_is_reported_and_the_other_half_of_the_matrix_is_used():
    text = sample("nvidia-2x3090-nv4-bridge-gpunumaid.txt").replace("GPU0\t X \tNV4", "GPU0\t X \tN?4", 1)
    result = parse_nvidia_topo_matrix(text)
    assert link(result, "GPU0", "GPU1")["code"] == "NV4"
    assert "GPU0/GPU1: unrecognised link code 'N?4'" in result["warnings"]


def test_an_asymmetric_matrix_keeps_the_first_rows_value_and_warns():
    text = sample("nvidia-2x3090-nv4-bridge-gpunumaid.txt").replace("GPU1\tNV4", "GPU1\tSYS", 1)
    result = parse_nvidia_topo_matrix(text)
    assert result["links"] == [{"a": "GPU0", "b": "GPU1", "kind": "nvlink", "code": "NV4", "nvlinks": 4}]
    assert result["warnings"] == ["matrix is not symmetric for GPU0/GPU1: 'NV4' vs 'SYS'; kept 'NV4'"]


def test_a_header_with_no_rows_is_returned_with_a_warning():
    result = parse_nvidia_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n")
    assert [d["name"] for d in result["devices"]] == ["GPU0", "GPU1"]
    assert result["links"] == []
    assert result["warnings"] == ["the matrix header has no rows under it (output truncated?)"]


@pytest.mark.parametrize("text", ["", "hello world\n", "GPU 0: NVIDIA H100 (UUID: GPU-1)\n\tLink 0: 26.562 GB/s\n"])
def test_text_without_a_matrix_header_is_rejected_with_a_clear_message(text):
    with pytest.raises(ValueError, match="not nvidia-smi topo -m output"):
        parse_nvidia_topo_matrix(text)


# --- nvidia-smi nvlink ----------------------------------------------------------------------


def test_nvlink_status_lists_each_gpus_links_with_their_speed():
    result = parse_nvidia_nvlink_status(sample("nvidia-3xrtxa6000-nvlink-status.txt"))
    assert result["tool"] == "nvidia-smi nvlink --status"
    gpu0 = result["gpus"][0]
    assert (gpu0["index"], gpu0["name"]) == (0, "NVIDIA RTX A6000")
    assert gpu0["uuid"] == "GPU-5baec991-de63-c196-1766-04c38407e133"
    assert gpu0["links"] == [{"link": n, "active": True, "speed_gb_s": 14.062} for n in range(4)]
    assert gpu0["active_links"] == 4
    assert result["warnings"] == []


def test_a_gpu_whose_links_are_all_inactive_has_no_links_and_says_so():
    gpu2 = parse_nvidia_nvlink_status(sample("nvidia-3xrtxa6000-nvlink-status.txt"))["gpus"][2]
    assert gpu2["links"] == []
    assert gpu2["active_links"] == 0
    assert gpu2["all_links_inactive"] is True


def test_inactive_links_have_no_speed_and_are_counted_apart():
    result = parse_nvidia_nvlink_status(sample("nvidia-2xh100pcie-nvlink-status-inactive.txt"))
    for gpu in result["gpus"]:
        assert len(gpu["links"]) == 18
        assert gpu["active_links"] == 12
        inactive = [x["link"] for x in gpu["links"] if not x["active"]]
        assert inactive == [4, 5, 10, 11, 16, 17]
        assert {x["speed_gb_s"] for x in gpu["links"] if not x["active"]} == {None}
        assert {x["speed_gb_s"] for x in gpu["links"] if x["active"]} == {26.562}
    assert result["warnings"] == []


def test_an_elided_nvlink_listing_keeps_the_gpus_shown_and_names_the_missing_ones():
    result = parse_nvidia_nvlink_status(sample("nvidia-8xh800-nvlink-status-elided.txt"))
    assert [gpu["index"] for gpu in result["gpus"]] == [0, 1, 7]
    assert all(gpu["active_links"] == 8 for gpu in result["gpus"])
    assert result["warnings"] == [
        "output was elided ('...'): some GPUs are missing",
        "GPUs missing from the output: 2, 3, 4, 5, 6",
    ]


def test_redacted_uuids_are_kept_as_printed():
    result = parse_nvidia_nvlink_status(sample("nvidia-2x3090-nvlink-status.txt"))
    assert [gpu["uuid"] for gpu in result["gpus"]] == ["GPU-略-332e-08e4-72fe-略", "GPU-略-cf8f-1503-b7b9-略"]
    assert [gpu["active_links"] for gpu in result["gpus"]] == [4, 4]


def test_nvlink_remote_output_gives_each_links_far_end():
    result = parse_nvidia_nvlink_status(sample("nvidia-2xh100pcie-nvlink-remote-R.txt"))
    assert result["tool"] == "nvidia-smi nvlink -R"
    gpu0_link4 = result["gpus"][0]["links"][4]
    assert gpu0_link4 == {"link": 4, "active": True, "remote_pci_bus_id": "00000000:D5:00.0", "remote_link": 6}
    assert len(result["gpus"][1]["links"]) == 12


def test_text_without_gpu_lines_is_not_nvlink_output():
    with pytest.raises(ValueError, match="not nvidia-smi nvlink output"):
        parse_nvidia_nvlink_status(sample("amd-4xmi300a-rocm-smi-showtopo.txt"))


# --- rocm-smi --showtopo ----------------------------------------------------------------------


def test_mi300a_is_an_xgmi_all_to_all_with_weight_15_and_one_hop():
    result = parse_rocm_showtopo(sample("amd-4xmi300a-rocm-smi-showtopo.txt"))
    assert result["tool"] == "rocm-smi --showtopo"
    assert len(result["links"]) == 6
    assert all(x["kind"] == "xgmi" and x["code"] == "XGMI" for x in result["links"])
    assert {(x["weight"], x["hops"]) for x in result["links"]} == {(15, 1)}
    assert [(d["numa_node"], d["numa_affinity"]) for d in result["devices"]] == [(n, str(n)) for n in range(4)]
    assert result["warnings"] == []


def test_mi308x_splits_its_gpus_over_two_numa_nodes_and_reports_the_low_power_warning():
    result = parse_rocm_showtopo(sample("amd-8xmi308x-rocm-smi-showtopo.txt"))
    assert Counter(x["kind"] for x in result["links"]) == {"xgmi": 28}
    expected = {"a": "GPU3", "b": "GPU4", "kind": "xgmi", "code": "XGMI", "weight": 15, "hops": 1}
    assert link(result, "GPU3", "GPU4") == expected
    assert [d["numa_node"] for d in result["devices"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert result["warnings"] == [
        "rocm-smi: WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status"
    ]


def test_mi100_over_pcie_gives_pcie_links_with_weight_and_hops():
    result = parse_rocm_showtopo(sample("amd-4xmi100-rocm-smi-showtopo-pcie.txt"))
    assert Counter(x["kind"] for x in result["links"]) == {"pcie": 6}
    expected = {"a": "GPU0", "b": "GPU2", "kind": "pcie", "code": "PCIE", "weight": 40, "hops": 2}
    assert link(result, "GPU0", "GPU2") == expected
    assert link(result, "GPU0", "GPU1")["weight"] == 72
    assert link(result, "GPU0", "GPU1")["hops"] == 3
    assert [d["numa_node"] for d in result["devices"]] == [7, 1, 7, 1]
    assert result["warnings"] == []


def test_a_truncated_mi250_keeps_its_non_uniform_weights_and_reports_what_is_missing():
    result = parse_rocm_showtopo(sample("amd-8xmi250-gcd-rocm-smi-showtopo-TRUNCATED.txt"))
    assert len(result["links"]) == 28
    assert link(result, "GPU0", "GPU1")["weight"] == 15
    assert link(result, "GPU0", "GPU3")["weight"] == 30
    assert link(result, "GPU1", "GPU7")["weight"] == 45
    assert Counter(x["weight"] for x in result["links"]) == {15: 12, 30: 14, 45: 2}
    assert all(x["kind"] == "unknown" and "hops" not in x for x in result["links"])
    assert device(result, "GPU0")["numa_node"] is None
    assert "output ends before 'End of ROCm SMI Log' (truncated?)" in result["warnings"]
    assert "the 'Hops between two GPUs' table has a header but no rows (output truncated?)" in result["warnings"]


def test_the_partition_mode_known_issue_reads_link_types_printed_under_the_weight_title():
    result = parse_rocm_showtopo(sample("amd-mi300-tpx-12part-rocm-smi-showtopo-KNOWNISSUE.txt"))
    assert len(result["devices"]) == 12
    assert len(result["links"]) == 66
    unknown = [(x["a"], x["b"]) for x in result["links"] if x["kind"] == "unknown"]
    assert len(unknown) == 12  # the XXXX cells: GPU1-4 among themselves and GPU5-8 among themselves
    assert ("GPU1", "GPU2") in unknown and ("GPU5", "GPU8") in unknown
    assert link(result, "GPU8", "GPU9") == {"a": "GPU8", "b": "GPU9", "kind": "xgmi", "code": "XGMI"}
    assert (device(result, "GPU3")["numa_node"], device(result, "GPU3")["numa_affinity"]) == (0, "2")
    warnings = "\n".join(result["warnings"])
    assert "ERROR: GPU[1]   : Cannot read Link Weight" in warnings
    assert "holds link types, not numbers" in warnings


def test_nvidia_output_is_not_rocm_smi_output():
    with pytest.raises(ValueError, match="not rocm-smi --showtopo output"):
        parse_rocm_showtopo(sample("nvidia-2x3090-nv4-bridge-gpunumaid.txt"))


# --- amd-smi topology -------------------------------------------------------------------------


def test_amd_smi_on_8_mi300x_gives_28_xgmi_links_with_weight_hops_and_numa_bandwidth():
    result = parse_amd_smi_topology(sample("amd-8xmi300x-amd-smi-topology-rocm6.1-changelog.txt"))
    assert result["tool"] == "amd-smi topology"
    assert result["devices"][3] == {"name": "GPU3", "kind": "gpu", "index": 3, "bdf": "0000:5c:00.0"}
    assert len(result["links"]) == 28
    assert link(result, "GPU0", "GPU7") == {
        "a": "GPU0",
        "b": "GPU7",
        "kind": "xgmi",
        "code": "XGMI",
        "accessible": True,
        "weight": 15,
        "hops": 1,
        "numa_bw": "50000-50000",
    }
    assert result["warnings"] == []


def test_amd_smi_cndz_tables_give_coherency_atomics_dma_and_bidirectional_flags():
    result = parse_amd_smi_topology(sample("amd-8xmi300x-amd-smi-topology-cndz-changelog.txt"))
    assert link(result, "GPU0", "GPU1") == {
        "a": "GPU0",
        "b": "GPU1",
        "kind": "unknown",  # no LINK TYPE table in -cndz output
        "code": None,
        "coherent": True,
        "atomics": "64,32",
        "dma": True,
        "bidirectional": True,
    }
    gpu0_gpu3 = link(result, "GPU0", "GPU3")
    assert (gpu0_gpu3["coherent"], gpu0_gpu3["atomics"], gpu0_gpu3["dma"]) == (False, "64", False)
    assert "atomics" not in link(result, "GPU0", "GPU6")  # N/A
    assert result["warnings"] == []


def test_amd_smi_on_two_radeons_gives_one_disabled_pcie_link_two_hops_apart():
    result = parse_amd_smi_topology(sample("amd-2xrx7900xtx-amd-smi-topology-pcie.txt"))
    assert [d["bdf"] for d in result["devices"]] == ["0000:03:00.0", "0000:0c:00.0"]
    assert result["links"] == [
        {"a": "GPU0", "b": "GPU1", "kind": "pcie", "code": "PCIE", "accessible": False, "weight": 40, "hops": 2}
    ]
    assert result["warnings"] == []


def test_rocm_smi_output_is_not_amd_smi_output():
    with pytest.raises(ValueError, match="not amd-smi topology output"):
        parse_amd_smi_topology(sample("amd-4xmi300a-rocm-smi-showtopo.txt"))


# --- parse_topology ---------------------------------------------------------------------------


def expected_tool(name: str) -> str:
    if "amd-smi" in name:
        return "amd-smi topology"
    if "rocm-smi" in name:
        return "rocm-smi --showtopo"
    if "nvlink-remote" in name:
        return "nvidia-smi nvlink -R"
    if "nvlink" in name:
        return "nvidia-smi nvlink --status"
    return "nvidia-smi topo -m"


@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_every_sample_is_recognised_and_gives_json_ready_data(name):
    result = parse_topology(sample(name))
    assert result["tool"] == expected_tool(name)
    assert json.loads(json.dumps(result)) == result


def test_there_are_samples_of_each_tool():
    assert Counter(expected_tool(name) for name in ALL_SAMPLES) == {
        "nvidia-smi topo -m": 18,
        "nvidia-smi nvlink --status": 4,
        "nvidia-smi nvlink -R": 1,
        "rocm-smi --showtopo": 5,
        "amd-smi topology": 3,
    }


def test_a_matrix_after_other_text_is_still_found():
    text = "NVIDIA Topology:\n" + sample("nvidia-8xh20-nv18-8nic-gpunumaid.txt") + "\nHypervisor vendor: KVM\n"
    result = parse_topology(text)
    assert codes(links_between(result, "gpu", "gpu")) == {"NV18": 28}


NVIDIA_SMI_L = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-34bf77d1-c686-6821-79a8-32d326c5039c)\n"


@pytest.mark.parametrize("text", ["", "   \n", "No devices were found\n", NVIDIA_SMI_L])
def test_unrecognisable_text_raises_value_error(text):
    with pytest.raises(ValueError, match="unrecognised topology output"):
        parse_topology(text)


# --- collect_topology (fake tools on PATH) ---------------------------------------------------


def fake_tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def prints_sample_for(arguments: str, name: str) -> str:
    # Exits 3 when called with other arguments, so the test also checks the command line.
    return f'[ "$*" = "{arguments}" ] || exit 3\nexec /bin/cat "{SAMPLES / name}"\n'


def test_collect_returns_none_when_no_topology_tool_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert collect_topology() is None


def test_collect_runs_nvidia_smi_topo_m_and_parses_it(tmp_path, monkeypatch):
    fake_tool(tmp_path, "nvidia-smi", prints_sample_for("topo -m", "nvidia-8xh100-nv18-12nic-gpunumaid-xd670.txt"))
    fake_tool(tmp_path, "rocm-smi", "exit 1\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    result = collect_topology()
    assert result["tool"] == "nvidia-smi topo -m"
    assert codes(links_between(result, "gpu", "gpu")) == {"NV18": 28}


def test_collect_runs_rocm_smi_showtopo_when_there_is_no_nvidia_smi(tmp_path, monkeypatch):
    fake_tool(tmp_path, "rocm-smi", prints_sample_for("--showtopo", "amd-8xmi308x-rocm-smi-showtopo.txt"))
    monkeypatch.setenv("PATH", str(tmp_path))
    result = collect_topology()
    assert result["tool"] == "rocm-smi --showtopo"
    assert len(result["links"]) == 28


def test_collect_runs_amd_smi_topology_when_it_is_the_only_tool(tmp_path, monkeypatch):
    fake_tool(tmp_path, "amd-smi", prints_sample_for("topology", "amd-2xrx7900xtx-amd-smi-topology-pcie.txt"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert collect_topology()["links"][0]["weight"] == 40


def test_collect_keeps_output_printed_before_a_non_zero_exit(tmp_path, monkeypatch):
    script = f'/bin/cat "{SAMPLES / "amd-mi300-tpx-12part-rocm-smi-showtopo-KNOWNISSUE.txt"}"\nexit 2\n'
    fake_tool(tmp_path, "rocm-smi", script)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = collect_topology()
    assert len(result["links"]) == 66
    assert result["warnings"][-1] == "exited with status 2"


def test_collect_reports_a_failing_tool_as_an_error(tmp_path, monkeypatch):
    message = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    fake_tool(tmp_path, "nvidia-smi", f'echo "{message}" >&2\nexit 9\n')
    monkeypatch.setenv("PATH", str(tmp_path))
    assert collect_topology() == {
        "error": f"nvidia-smi topo -m failed: exit status 9: {message}",
        "tool": "nvidia-smi topo -m",
    }


def test_collect_reports_unparseable_output_as_an_error(tmp_path, monkeypatch):
    fake_tool(tmp_path, "nvidia-smi", "echo 'No devices were found'\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    result = collect_topology()
    assert result["error"].startswith("nvidia-smi topo -m failed: not nvidia-smi topo -m output")


def test_collect_gives_up_on_a_tool_that_hangs(tmp_path, monkeypatch):
    fake_tool(tmp_path, "nvidia-smi", "exec /bin/sleep 30\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert collect_topology(timeout=0.5) == {
        "error": "nvidia-smi topo -m did not finish within 0.5 s",
        "tool": "nvidia-smi topo -m",
    }
