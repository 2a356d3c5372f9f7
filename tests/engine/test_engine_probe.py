"""The probe stage and its command, without Django or a broker."""

import json
import subprocess
import sys

import psutil
import pytest

from workers.engine.envcheck.probe import probe_devices
from workers.engine.envcheck.stage import env_probe
from workers.engine.stages import STAGES, run_stage


def test_a_cpu_only_node_reports_its_cpu_as_device_zero():
    devices = probe_devices()
    assert devices[0]["kind"] == "cpu" and devices[0]["index"] == 0
    assert devices[0]["memory_bytes"] == psutil.virtual_memory().total


def test_the_probe_reports_progress_and_plain_json():
    reports = []
    result = env_probe({}, lambda fraction, message: reports.append(fraction))
    assert reports == sorted(reports) and reports[-1] < 1
    assert json.loads(json.dumps(result)) == result
    assert result["software"]["torch"].startswith("2.13")


def test_an_unknown_stage_kind_names_the_known_ones():
    with pytest.raises(ValueError, match="knows env_probe"):
        run_stage("teleport", {}, lambda *_: None)
    assert "env_probe" in STAGES


# Runs code as on a bare GPU node: Django and the web app cannot be imported at all.
WITHOUT_DJANGO = "import sys; [sys.modules.__setitem__(name, None) for name in ('django', 'adaptation', 'd0web')];"


@pytest.mark.slow
def test_the_probe_command_prints_json_on_a_node_without_django():
    code = WITHOUT_DJANGO + "import runpy; sys.argv = ['workers.engine', 'probe', '--json']; " \
                            "runpy.run_module('workers.engine', run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"host", "devices", "software"}
    assert report["devices"][0]["kind"] == "cpu"


def test_the_node_worker_runs_on_a_node_without_django():
    code = WITHOUT_DJANGO + "import workers.node; workers.node.main(['--help'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--cluster" in result.stdout
