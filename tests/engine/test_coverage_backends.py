"""Virtual backends generated from torch's own ``native_functions.yaml`` and what coverage says about them:
an operator counts as covered by what the target backend can run — a kernel of its own, a composite kernel
whose callees it covers, a decomposition into aten operators it lists — and every answer is checked here against the
yaml's entries, not against the classifier's own reading of them.
"""

import json
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch
from torch._decomp import decomposition_table

from workers.engine.coverage.classify import Classifier, classify_trace, lookup_operator, summarise
from workers.engine.coverage.native_functions import (
    COMPOSITE_KEYS,
    GENERATED_KEYS,
    composite_operators,
    kernel_table,
    operators_with,
)
from workers.engine.coverage.report import run_coverage
from workers.engine.coverage.shipped_backends import composite_kernels, shipped_backends
from workers.engine.coverage.tracing import capture_example, trace_model
from workers.engine.coverage.virtual_backend import load_backend, split_operator, virtual_backend
from workers.engine.models import load_config
from workers.engine.models.loading import build_random_model
from workers.engine.models.reducer import reduce_config

from .conftest import CONFIGS

MODELS = ("qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b")
# What the classifier reported missing on torch 2.13's CUDA and MPS lists before: each has a
# CompositeExplicitAutograd kernel whose callees those backends have.
OLD_FALSE_GAPS = {"aten::_to_copy", "aten::arange", "aten::index_put_", "aten::unsqueeze", "aten::clone", "aten::copy_",
                  "aten::expand", "aten::masked_fill", "aten::ones", "aten::zeros_like", "aten::t", "aten::transpose"}
CPU_ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu.default"
ATTENTION = "aten::scaled_dot_product_attention.default"


def config(model: str) -> dict:
    return json.loads((CONFIGS / f"{model}.json").read_text())


def shipped(dispatch_key: str) -> dict:
    return next(backend for backend in shipped_backends() if backend["dispatch_key"] == dispatch_key)


@pytest.fixture(scope="module")
def table():
    return kernel_table()


@pytest.fixture(scope="module")
def cuda_reports():
    """The acceptance command itself, on the generated CUDA list file."""
    reports = {}
    for model in MODELS:
        command = [sys.executable, "-m", "workers.engine", "coverage", str(CONFIGS / f"{model}.json"), "--json",
                   "--backend-list", shipped("CUDA")["path"]]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        reports[model] = json.loads(result.stdout)
    return reports


@pytest.fixture(scope="module")
def mps_reports():
    return {model: run_coverage(config(model), backend_list=shipped("MPS")["name"], decode_steps=1)
            for model in MODELS}


@pytest.fixture(scope="module")
def qwen3_trace():
    """One trace of the reduced Qwen3-30B-A3B, judged below against several lists."""
    reduction = reduce_config(config("qwen3-30b-a3b"))
    model = build_random_model(load_config(reduction.config), dtype=torch.bfloat16, device=torch.device("cpu"))
    trace = trace_model(model, decode_steps=1)
    assert trace.error is None
    return trace.operators


def composite_key(table, name: str) -> str | None:
    """The composite kernel the dispatcher gives a backend without a kernel of its own (its order of preference)."""
    return next((key for key in COMPOSITE_KEYS if key in table.get(name, ())), None)


def assert_judged_as_the_yaml_says(entry: dict, table, dispatch_key: str) -> None:
    """Native means the yaml declares a kernel for the key; composite means it declares none but a composite
    kernel, and each operator that kernel called is the backend's own or composite again."""
    name, status = entry["name"], entry["status"]
    if status == "native":
        assert dispatch_key in table[name], f"{name} is native on {dispatch_key} without a kernel in the yaml"
    elif status == "composite":
        assert dispatch_key not in table[name]
        if name == ATTENTION:  # CompositeImplicitAutograd, choosing among the backend's fused kernels
            assert entry["kernel"] == "CompositeImplicitAutograd" == composite_key(table, name)
        else:
            assert entry["kernel"] == composite_key(table, name), name
        for basic in entry["basic_operators"]:
            assert not basic["name"].startswith("prims::")
            if basic["status"] == "native":
                assert dispatch_key in table[basic["name"]], (name, basic)
            else:
                assert basic["status"] == "composite" and composite_key(table, basic["name"]), (name, basic)
    else:
        # A gap: no kernel of its own, and no composite path (none, or one that calls an operator the backend
        # lacks, which has neither itself).
        assert dispatch_key not in table[name]
        leaves = [basic["name"] for basic in entry["basic_operators"] or [] if basic["status"] not in ("native",
                                                                                                      "composite")]
        assert composite_key(table, name) is None or leaves, name
        for leaf in leaves:
            assert dispatch_key not in table.get(leaf, ()), (name, leaf)


def test_the_kernel_table_read_from_the_yaml_agrees_with_this_torchs_dispatcher(table):
    """The CPU kernels and the composite kernels can be checked on this (CPU) build: the rules that read the CUDA
    and MPS lists from the same yaml give exactly what torch registered."""
    disagreements, checked = [], 0
    for name, keys in table.items():
        operator = lookup_operator(name)
        if operator is None:
            continue
        checked += 1
        for key in ("CPU", *COMPOSITE_KEYS):
            registered = torch._C._dispatch_has_kernel_for_dispatch_key(operator.name(), key)
            if (key in keys) != registered:
                disagreements.append((name, key, registered))
    assert checked > 2500 and disagreements == []


def test_the_shipped_backends_are_the_installed_torchs_kernel_lists(table):
    """Bumping torch without running scripts/generate-virtual-backends.py fails here."""
    installed = version("torch").split("+")[0]
    assert sorted(backend["dispatch_key"] for backend in shipped_backends()) == sorted(GENERATED_KEYS)
    for backend in shipped_backends():
        assert backend["torch"] == installed
        assert backend["operators"] == operators_with(table, backend["dispatch_key"])
    assert composite_kernels() == {key: frozenset(names) for key, names in composite_operators(table).items()}
    # What torch 2.13's yaml holds: the lists are the backends' own kernels, nothing more.
    if installed.startswith("2.13."):
        assert (len(shipped("CUDA")["operators"]), len(shipped("MPS")["operators"])) == (1268, 890)


def test_a_shipped_backend_is_loaded_by_its_name_or_its_file_with_its_dispatch_key():
    by_name, by_file = load_backend(shipped("MPS")["name"]), load_backend(shipped("MPS")["path"])
    assert by_name == by_file and by_name.dispatch_key == "MPS" and by_name.name == f"virtual:{shipped('MPS')['name']}"
    assert by_name.lists("aten::mm.default") and not by_name.lists("aten::_to_copy.default")


@pytest.mark.parametrize("model", MODELS)
def test_the_generated_cuda_list_covers_every_operator_of_the_model(cuda_reports, table, model):
    report = cuda_reports[model]
    assert report["backend"]["virtual"] and report["backend"]["dispatch_key"] == "CUDA"
    assert report["coverage"] == 1.0 and report["gaps"] == [], report["gaps"]
    for entry in report["operators"]:
        assert_judged_as_the_yaml_says(entry, table, "CUDA")


@pytest.mark.parametrize("model", MODELS)
def test_the_mps_lists_gaps_are_operators_without_an_mps_kernel_or_a_composite_path(mps_reports, table, model):
    report = mps_reports[model]
    assert report["backend"]["dispatch_key"] == "MPS"
    for entry in report["operators"]:
        assert_judged_as_the_yaml_says(entry, table, "MPS")
    assert set(report["gaps"]) == {entry["name"] for entry in report["operators"]
                                   if entry["status"] not in ("native", "composite")}


def test_the_old_false_gaps_run_through_their_composite_kernels(cuda_reports, mps_reports, table):
    judged = [entry for report in [*cuda_reports.values(), *mps_reports.values()] for entry in report["operators"]]
    old = [entry for entry in judged if split_operator(entry["name"])[0] in OLD_FALSE_GAPS]
    assert {split_operator(entry["name"])[0] for entry in old} >= {"aten::_to_copy", "aten::arange",
                                                                   "aten::unsqueeze", "aten::t", "aten::transpose"}
    for entry in old:
        assert entry["status"] == "composite" and entry["kernel"] == "CompositeExplicitAutograd", entry
    text = json.dumps(judged)
    assert "prims::" not in text, "no suggestion or callee names an operator no aten list contains"


def test_the_cpu_attention_kernel_is_judged_as_scaled_dot_product_attention(cuda_reports, mps_reports):
    for reports, fused in ((cuda_reports, "aten::_scaled_dot_product_flash_attention.default"),
                           (mps_reports, "aten::_scaled_dot_product_attention_math_for_mps.default")):
        operators = {entry["name"]: entry for entry in reports["qwen3-30b-a3b"]["operators"]}
        assert not any(name.endswith("_for_cpu.default") for name in operators)
        attention = operators[ATTENTION]
        assert attention["traced_as"] == CPU_ATTENTION and attention["status"] == "composite"
        assert fused in {basic["name"] for basic in attention["basic_operators"]}


def test_attention_without_a_fused_kernel_falls_back_to_the_math_composite(qwen3_trace):
    cuda = shipped("CUDA")["operators"]
    backend = virtual_backend([name for name in cuda if "_attention" not in name], name="no-fused-attention")
    attention = {entry["name"]: entry for entry in classify_trace(qwen3_trace, backend)}[ATTENTION]
    assert attention["status"] == "composite" and "math composite" in attention["note"]
    called = {basic["name"] for basic in attention["basic_operators"]}
    assert {"aten::_safe_softmax.default", "aten::bmm.default"} <= called


def test_an_operator_only_backends_implement_is_still_missing_and_the_fix_names_what_the_backend_lacks(
        qwen3_trace, table):
    # histc has CPU/CUDA/MPS kernels and nothing else; topk's functional form calls topk.values (a structured
    # kernel); as_strided is what the views' composite kernels call.
    assert table["aten::histc.default"] == {"CPU", "CUDA", "MPS"}
    assert torch.ops.aten.histc.default not in decomposition_table
    assert composite_key(table, "aten::as_strided.default") is None
    removed = {"aten::histc.default", "aten::topk.default", "aten::topk.values", "aten::as_strided.default"}
    backend = virtual_backend([name for name in shipped("CUDA")["operators"] if name not in removed])
    entries = {entry["name"]: entry for entry in classify_trace(qwen3_trace, backend)}
    histc, topk, unsqueeze = (entries[f"aten::{name}"] for name in ("histc.default", "topk.default",
                                                                      "unsqueeze.default"))
    assert histc["status"] == "missing" and histc["suggestion"] == "write a kernel for aten::histc.default"
    assert topk["status"] == "missing" and "aten::topk.values" in topk["suggestion"]
    assert unsqueeze["status"] == "missing" and "aten::as_strided.default" in unsqueeze["suggestion"]
    gaps = set(summarise(list(entries.values()))["gaps"])
    assert {"aten::histc.default", "aten::topk.default", "aten::unsqueeze.default"} <= gaps
    for name in gaps - {"aten::histc.default", "aten::topk.default"}:
        assert "aten::as_strided.default" in entries[name]["suggestion"], name
    everything = {entry["name"]: entry for entry in classify_trace(qwen3_trace, virtual_backend(shipped("CUDA")[
        "operators"]))}
    assert summarise(list(everything.values()))["gaps"] == []


def test_a_decomposition_into_prims_is_not_counted_and_not_suggested():
    example = capture_example((torch.randn(4, 8),), {})
    isnan = Classifier(virtual_backend(["aten::ne", "aten::mm"])).classify(torch.ops.aten.isnan.default, example)
    assert isnan.status == "missing" and isnan.decomposition == "torch._decomp"
    assert "prims::ne.default" in isnan.note and isnan.suggestion == "write a kernel for aten::isnan.default"


def test_a_composite_path_through_an_operator_the_backend_lacks_falls_back_to_a_decomposition():
    # silu's composite kernel calls silu.out, which this backend lacks; its torch._decomp decomposition needs
    # only sigmoid and mul, which it has.
    example = capture_example((torch.randn(4, 8),), {})
    silu = Classifier(virtual_backend(["aten::sigmoid", "aten::mul"])).classify(torch.ops.aten.silu.default, example)
    assert silu.status == "decomposable" and silu.decomposition == "torch._decomp"
    assert "aten::sigmoid.default" in silu.suggestion and "aten::silu.out" not in silu.suggestion
