"""The env-check engine: bus-bandwidth formulas, checks, and a real check of this machine (no Django)."""

import json
import subprocess
import sys

import pytest

from workers.engine.envcheck import checks
from workers.engine.envcheck.busbw import bus_bandwidth
from workers.engine.envcheck import env_check
from workers.engine.envcheck.peaks import published_peak

WITHOUT_DJANGO = "import sys; [sys.modules.__setitem__(name, None) for name in ('django', 'adaptation', 'd0web')];"


@pytest.mark.parametrize("collective, ranks, factor", [
    # nccl-tests doc/PERFORMANCE.md: all_reduce 2(n-1)/n; all_gather and all_to_all (n-1)/n.
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_gather", 8, 0.875), ("all_to_all", 4, 0.75),
    ("all_reduce", 1, 0.0),
])
def test_bus_bandwidth_follows_nccl_tests(collective, ranks, factor):
    # 1 GB in 0.5 s is an algorithm bandwidth of 2 GB/s whatever the collective.
    figures = bus_bandwidth(collective, 10**9, 0.5, ranks)
    assert figures["algbw"] == pytest.approx(2e9)
    assert figures["busbw"] == pytest.approx(2e9 * factor)


def test_bus_bandwidth_rejects_nonsense():
    with pytest.raises(ValueError):
        bus_bandwidth("all_reduce", 10, 0, 2)


def test_published_peaks_match_device_names_as_torch_reports_them():
    assert published_peak("NVIDIA H200")["memory_bandwidth"] == 4.8e12
    assert published_peak("NVIDIA H100 PCIe")["matched"] == "H100 PCIe"
    assert published_peak("NVIDIA H100 80GB HBM3")["matched"] == "H100"
    assert published_peak("AMD Instinct MI300X")["bf16_flops"] == 1307e12
    assert published_peak("AMD EPYC 9654") is None


def test_fewer_devices_than_the_cluster_expects_fails_with_an_actionable_message():
    devices = [{"kind": "cuda", "index": i, "name": "H100"} for i in range(4)]
    result = checks.device_count_check([{"kind": "cpu", "index": 0, "name": "EPYC"}, *devices], expected=8)
    assert result["status"] == "fail"
    assert result["message"].startswith("Found 4 accelerator(s) but the cluster expects 8 per node.")
    assert "CUDA_VISIBLE_DEVICES" in result["message"]


def test_missing_peer_access_warns_and_names_the_pairs():
    [result] = checks.peer_access_checks([[None, True, False], [True, None, True], [False, True, None]])
    assert result["status"] == "warn"
    assert "2 device pair(s) (0→2, 2→0)" in result["message"]


def test_a_figure_far_below_the_published_peak_warns():
    per_device = [{"device": "cuda:0", "name": "NVIDIA H200",
                   "copy_bandwidth": {"bytes_per_s": 4.1e12}, "matmul": {"bf16": {"flops_per_s": 200e12}}}]
    bandwidth, matmul = checks.peak_checks(per_device)
    assert (bandwidth["status"], round(bandwidth["details"]["ratio"], 3)) == ("pass", 0.854)
    assert "4.10 TB/s measured, 85% of the published 4.80 TB/s (H200)" in bandwidth["message"]
    assert matmul["status"] == "warn" and "far below peak" in matmul["message"]


def test_a_missing_required_package_fails():
    [result] = checks.package_checks({"torch": "2.13.0", "transformers": "absent"})
    assert result["status"] == "fail" and "transformers" in result["message"]
    assert checks.verdict([{"status": "pass"}, result]) == "fail"


@pytest.fixture(scope="module")
def report():
    return env_check({"expected_devices_per_node": 1, "measure_seconds": 0.1}, lambda *_: None)


@pytest.mark.slow
def test_a_check_of_this_machine_measures_memory_matmul_and_collectives(report):
    cpu = report["measurements"]["per_device"][0]
    assert cpu["device"] == "cpu:0"
    assert cpu["copy_bandwidth"]["bytes_per_s"] > 1e8
    assert cpu["matmul"]["fp32"]["flops_per_s"] > 1e8
    assert cpu["matmul"]["fp8"]["supported"] is False
    all_reduce = report["measurements"]["collectives"]["results"]["all_reduce"]
    assert report["measurements"]["collectives"]["backend"] == "gloo"
    assert all_reduce["busbw"] == pytest.approx(all_reduce["algbw"])  # 2(n-1)/n = 1 for 2 ranks
    # Every check passes but, on a machine shared with other work, the repetitions' agreement (a warning then)
    assert all(check["status"] == "pass" for check in report["checks"] if check["name"] != "repeatability")
    assert report["verdict"] in ("pass", "warn")
    assert report["links"] == [{"a": "cpu:0", "b": "cpu:0", "kind": "loopback", "code": "gloo", "p2p_ok": None,
                                "measured_bytes_per_s": all_reduce["busbw"]}]
    assert report["devices"][0]["free_memory_bytes"] > 0
    assert json.loads(json.dumps(report)) == report


@pytest.mark.slow
def test_the_envcheck_command_prints_the_report_without_django():
    code = WITHOUT_DJANGO + ("import runpy; sys.argv = ['x', 'envcheck', '--json', '--expected-devices', '8', "
                             "'--measure-seconds', '0.05']; runpy.run_module('workers.engine', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"host", "software", "devices", "links", "measurements", "checks"} <= set(report)
    assert report["verdict"] == "fail"
    assert report["checks"][0]["message"].startswith("Found 1 CPU device(s) but the cluster expects 8 per node.")
