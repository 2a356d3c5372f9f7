"""Operator coverage (workers/engine/coverage) on this machine's CPU, without Django or a broker.

Every model is reduced, built and traced once per module (``reports``); the tests read those reports.
"""

import json
import subprocess
import sys

import pytest
import torch

from workers.engine.coverage import op_coverage, run_coverage
from workers.engine.coverage.classify import COVERED, Classifier
from workers.engine.coverage.tracing import capture_example
from workers.engine.coverage.virtual_backend import load_operator_list, virtual_backend
from workers.engine.models import build_meta_model, load_config
from workers.engine.models.reducer import compare_module_classes, layer_kinds, reduce_config

from .conftest import CONFIGS
MODELS = {
    "deepseek-v3": "deepseek-v3.json",  # MLA, group-limited MoE, dense prefix, MTP declared
    "qwen3-moe": "qwen3-30b-a3b.json",
    "llama4-scout": "llama-4-scout-17b-16e-instruct.partial.json",  # every layer MoE, QK norm, chunked attention
    "llama4-maverick": "llama-4-maverick-17b-128e-instruct.partial.json",  # dense/MoE interleave step 2
    "gpt-oss": "gpt-oss-20b.json",  # sliding/full layer_types, attention sinks
    "glm4-moe": "glm-4.7.json",  # GLM-4.5 stand-in: first dense layers, MTP declared
    "mixtral": "mixtral-8x7b-v0.1.json",
    "llama-dense": "llama-3.1-8b.json",
    "qwen3-dense": "qwen3-0.6b.json",
    "jamba": "jamba-v0.1.json",  # Mamba (linear attention) layers between attention layers
}
MOE_MODELS = ["deepseek-v3", "qwen3-moe", "llama4-scout", "llama4-maverick", "gpt-oss", "glm4-moe", "mixtral", "jamba"]
VIRTUAL_GAPS = {"aten::_grouped_mm.default", "aten::topk.default", "aten::histc.default"}
REPORT_KEYS = {"backend", "dtype", "operators", "mechanisms", "compile", "coverage", "reduced_config",
               "module_classes_match", "module_classes", "timings", "gaps", "summary", "trace", "reduction"}
# Shipped configs no transformers class fits: they are built as d0's generic decoder of their shape.
GENERIC = {"minimax-m1.json", "snowflake-arctic-instruct.json", "grok-1.json"}
# Runs code as on a bare GPU node: Django and the web app cannot be imported at all.
WITHOUT_DJANGO = "import sys; [sys.modules.__setitem__(name, None) for name in ('django', 'adaptation', 'd0web')];"


def model_config(model: str) -> dict:
    return json.loads((CONFIGS / MODELS[model]).read_text())


@pytest.fixture(scope="module")
def reports():
    return {model: run_coverage(model_config(model), dtype="bf16", check_compile=False) for model in MODELS}


def by_name(report: dict) -> dict:
    return {entry["name"]: entry for entry in report["operators"]}


@pytest.mark.parametrize("model", MODELS)
def test_the_reduced_model_keeps_every_module_class_and_layer_kind_of_the_full_model(reports, model):
    report = reports[model]
    assert report["module_classes_match"], report["module_classes"]
    assert report["module_classes"]["missing_in_reduced"] == report["module_classes"]["extra_in_reduced"] == []
    reduced_kinds = layer_kinds(build_meta_model(load_config(report["reduced_config"])))
    assert len(reduced_kinds) == len(report["reduction"]["layer_kinds"])
    assert report["reduction"]["layers"] <= 5 and report["reduction"]["parameters"] < 10_000_000


@pytest.mark.parametrize("model", MODELS)
def test_the_reduced_model_runs_prefill_and_decode_on_the_cpu_with_full_coverage(reports, model):
    report = reports[model]
    assert report["trace"]["error"] is None
    assert report["trace"]["decode_steps"] == 3
    assert report["coverage"] == 1.0 and report["gaps"] == []
    assert report["smoke"]["failed"] == [] and report["smoke"]["passed"] == len(report["operators"])
    assert all(entry["phases"].get("prefill") or entry["phases"].get("decode") for entry in report["operators"])


@pytest.mark.parametrize("name", sorted(path.name for path in CONFIGS.glob("*.json")))
def test_every_shipped_config_reduces_to_the_same_module_classes(name):
    config = json.loads((CONFIGS / name).read_text())
    reduction = reduce_config(config)
    reduced = build_meta_model(load_config(reduction.config))
    assert compare_module_classes(build_meta_model(load_config(config)), reduced)["match"]
    assert reduction.layers <= 8 < reduction.full_layers


def test_jambas_layer_periods_are_shortened_to_one_layer_per_kind():
    # Attention every 8th layer from the 4th and experts every 2nd from the 1st: 3 kinds, first all seen at layer 5.
    # Shorter periods show the same 3 kinds (Mamba + dense, Mamba + experts, attention + dense) in 3 layers, and
    # no fourth (attention + experts, which the release never has); each Mamba layer less is seconds of compile check.
    config = json.loads((CONFIGS / "jamba-v0.1.json").read_text())
    full = build_meta_model(load_config(config))
    reduction = reduce_config(config, full_model=full)
    assert reduction.layers == 3 and any("layer periods shortened" in note for note in reduction.notes)
    reduced = reduction.config
    attention = [index % reduced["attn_layer_period"] == reduced["attn_layer_offset"] for index in range(3)]
    experts = [index % reduced["expert_layer_period"] == reduced["expert_layer_offset"] for index in range(3)]
    assert sorted(zip(attention, experts, strict=True)) == [(False, False), (False, True), (True, False)]
    signatures = {signature for _, signature in layer_kinds(full)}
    assert {signature for _, signature in layer_kinds(build_meta_model(load_config(reduced)))} == signatures


def test_the_reduced_deepseek_v3_keeps_mla_head_dims_and_group_limited_routing(reports):
    reduced = reports["deepseek-v3"]["reduced_config"]
    config = load_config(reduced)
    assert config.head_dim == config.qk_rope_head_dim == 64
    assert (reduced["qk_nope_head_dim"], reduced["v_head_dim"]) == (128, 128)
    assert reduced["n_group"] == 2 and reduced["topk_group"] == 1
    assert reduced["n_routed_experts"] % reduced["n_group"] == 0
    assert reduced["num_experts_per_tok"] <= reduced["topk_group"] * reduced["n_routed_experts"] // reduced["n_group"]
    assert reduced["first_k_dense_replace"] == 1 and reduced["num_hidden_layers"] == 2
    assert "auto_map" not in reduced and "quantization_config" not in reduced
    notes = " ".join(reports["deepseek-v3"]["reduction"]["notes"])
    assert "MTP" in notes and "quantization_config (fp8) not applied" in notes
    assert {"aten::topk.default", "aten::_grouped_mm.default"} <= set(by_name(reports["deepseek-v3"]))


def test_the_reduced_llama4_maverick_keeps_its_interleave_step_dense_and_moe_layers(reports):
    report = reports["llama4-maverick"]
    assert report["reduced_config"]["interleave_moe_layer_step"] == 2
    kinds = report["reduction"]["layer_kinds"]
    assert any("Llama4TextMoe" in kind["classes"] for kind in kinds)
    assert any("Llama4TextMoe" not in kind["classes"] for kind in kinds)
    assert {kind["layer_type"] for kind in kinds} == {"chunked_attention", "full_attention"}
    assert report["architecture"] == "Llama4ForCausalLM"


def test_the_reduced_gpt_oss_keeps_sliding_and_full_attention_layers(reports):
    reduced = reports["gpt-oss"]["reduced_config"]
    assert reduced["layer_types"] == ["sliding_attention", "full_attention"]
    assert reduced["sliding_window"] < reports["gpt-oss"]["trace"]["prompt_tokens"]
    assert reduced["num_experts_per_tok"] == reduced["experts_per_token"] <= reduced["num_local_experts"]


def test_the_reduced_glm_keeps_a_first_dense_layer_before_the_moe_layers(reports):
    report = reports["glm4-moe"]
    assert report["reduced_config"]["first_k_dense_replace"] == 1
    first, second = report["reduction"]["layer_kinds"]
    assert "Glm4MoeMoE" not in first["classes"] and "Glm4MoeMoE" in second["classes"]


def test_the_reduced_jamba_keeps_mamba_and_attention_layers(reports):
    kinds = reports["jamba"]["reduction"]["layer_kinds"]
    assert {kind["layer_type"] for kind in kinds} == {"linear_attention", "full_attention"}
    assert any("JambaMambaMixer" in kind["classes"] for kind in kinds)


def test_every_report_is_plain_json_with_the_documented_keys(reports):
    for report in reports.values():
        assert REPORT_KEYS <= set(report)
        assert json.loads(json.dumps(report, allow_nan=False)) == report
        for entry in report["operators"]:
            assert entry["status"] in {"native", "composite", "decomposable", "missing", "failed"}
            assert entry["count"] >= 1 and "::" in entry["name"]


def test_mechanisms_say_which_attention_backends_take_the_model_head_dims(reports):
    dense, mla = reports["qwen3-dense"]["mechanisms"], reports["deepseek-v3"]["mechanisms"]
    assert "math" in dense["sdpa_usable"]
    assert mla["attention_shapes"] == [{"query_head_dim": 192, "value_head_dim": 128, "heads": 128, "kv_heads": 128,
                                        "kind": "mla"}]
    for mechanisms in (dense, mla):
        assert mechanisms["grouped_mm"]["available"] and mechanisms["grouped_mm"]["works"]
        assert mechanisms["float8"]["float8_e4m3fn"]["exists"]
        assert set(mechanisms["flash_attn"]) == {"flash_attn", "flash_attn_interface"}


@pytest.mark.parametrize("model", MOE_MODELS)
def test_a_virtual_backend_without_grouped_mm_topk_and_histc_reports_exactly_those_as_gaps(reports, model):
    traced = set(by_name(reports[model]))
    report = run_coverage(model_config(model), backend_list=sorted(traced - VIRTUAL_GAPS), check_compile=False)
    assert report["backend"]["virtual"] and report["compile"]["checked"] is False
    assert set(report["gaps"]) == traced & VIRTUAL_GAPS and report["gaps"]
    operators = by_name(report)
    for name in report["gaps"]:
        entry = operators[name]
        if entry["decomposition"] is None:
            assert entry["status"] == "missing" and entry["basic_operators"] == []
        else:
            assert entry["basic_operators"], "a decomposition lists the operators it becomes"
            covered = all(basic["status"] in COVERED for basic in entry["basic_operators"])
            assert entry["status"] == ("decomposable" if covered else "missing")
    for name in {"aten::topk.default", "aten::histc.default"} & set(report["gaps"]):
        assert operators[name]["status"] == "missing", "neither has a decomposition in torch"


def test_grouped_mm_runs_through_its_composite_kernel_once_the_operators_it_calls_are_listed(reports):
    traced = set(by_name(reports["qwen3-moe"]))
    lacking = run_coverage(model_config("qwen3-moe"), backend_list=sorted(traced - VIRTUAL_GAPS), check_compile=False)
    grouped_lacking = by_name(lacking)["aten::_grouped_mm.default"]
    basic = {item["name"] for item in grouped_lacking["basic_operators"]}
    assert "aten::mm.out" in basic and grouped_lacking["status"] == "missing"
    assert "aten::mm.out" in grouped_lacking["suggestion"], "the fix names the operators the backend lacks"
    listed = run_coverage(model_config("qwen3-moe"), backend_list=sorted((traced | basic) - VIRTUAL_GAPS),
                          check_compile=False)
    grouped = by_name(listed)["aten::_grouped_mm.default"]
    assert grouped["status"] == "composite" and grouped["kernel"] == "CompositeExplicitAutograd"
    assert listed["coverage"] < 1.0 and set(listed["gaps"]) == VIRTUAL_GAPS - {"aten::_grouped_mm.default"}


def test_a_composite_operator_needs_no_kernel_and_lists_what_it_becomes():
    example = capture_example((torch.randn(2, 8), torch.randn(4, 8)), {})
    linear = Classifier(virtual_backend(["aten::mm", "aten::t"])).classify(torch.ops.aten.linear.default, example)
    assert linear.status == "composite" and linear.kernel == "CompositeImplicitAutograd"
    assert {basic["name"] for basic in linear.basic_operators} == {"aten::t.default", "aten::mm.default"}


def test_an_operator_with_a_python_decomposition_is_decomposable_when_its_basic_operators_are_covered():
    example = capture_example((torch.randn(4, 8),), {})
    silu = torch.ops.aten.silu.default
    covered = Classifier(virtual_backend(["aten::sigmoid", "aten::mul", "aten::_to_copy"])).classify(silu, example)
    assert covered.status == "decomposable" and covered.decomposition == "torch._decomp"
    assert {basic["name"] for basic in covered.basic_operators} >= {"aten::sigmoid.default", "aten::mul.Tensor"}
    lacking = Classifier(virtual_backend(["aten::mul", "aten::_to_copy"])).classify(silu, example)
    assert lacking.status == "missing" and "aten::sigmoid.default" in lacking.note


def test_operator_lists_are_read_from_csv_and_json_files(tmp_path):
    (tmp_path / "ops.csv").write_text("operator,notes\naten::mm.default,fast\ntopk,# a whole op, every overload\n")
    (tmp_path / "plain.csv").write_text("aten::mm.default,aten::add.Tensor\n\nhistc\n")
    (tmp_path / "list.json").write_text('["aten::mm.default", "histc"]')
    (tmp_path / "object.json").write_text('{"aten::mm.default": "since v2", "aten::histc": ""}')
    assert load_operator_list(tmp_path / "ops.csv") == ["aten::mm.default", "aten::topk"]
    assert load_operator_list(tmp_path / "plain.csv") == ["aten::mm.default", "aten::add.Tensor", "aten::histc"]
    assert load_operator_list(tmp_path / "list.json") == ["aten::mm.default", "aten::histc"]
    assert load_operator_list(tmp_path / "object.json") == ["aten::mm.default", "aten::histc"]
    backend = virtual_backend(load_operator_list(tmp_path / "ops.csv"), name="vendor")
    assert backend.lists("aten::topk.values") and backend.lists("aten::mm.default")
    assert not backend.lists("aten::mm.out")


@pytest.fixture
def fancy_norm_without_a_cpu_kernel(monkeypatch):
    """A model whose RMSNorm calls ``d0test::fancy_norm``, an operator with a CUDA kernel and a fake (shape) kernel
    but none for the CPU, like a vendor-patched model on a node whose backend lacks the vendor's kernel."""
    from transformers.models.qwen3 import modeling_qwen3

    library = torch.library.Library("d0test", "FRAGMENT")
    library.define("fancy_norm(Tensor x, float eps) -> Tensor")
    library.impl("fancy_norm", lambda x, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), "CUDA")
    torch.library.register_fake("d0test::fancy_norm", lambda x, eps: torch.empty_like(x), lib=library)

    def forward(self, hidden_states):
        return self.weight * torch.ops.d0test.fancy_norm(hidden_states, self.variance_epsilon)

    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", forward)
    yield
    library._destroy()


def test_a_custom_operator_without_a_cpu_kernel_is_reported_and_the_report_still_comes_back(
        fancy_norm_without_a_cpu_kernel):
    report = run_coverage(model_config("qwen3-dense"), dtype="fp32", check_compile=False)
    fancy = by_name(report)["d0test::fancy_norm.default"]
    assert fancy["status"] == "failed" and fancy["kernel_status"] == "missing"
    assert fancy["failures"] == fancy["count"] > 0 and "CPU" in fancy["error"]
    assert fancy["smoke"]["passed"] is False
    assert report["gaps"] == ["d0test::fancy_norm.default"] and report["coverage"] < 1.0
    assert report["trace"]["error"] is None, "the fake kernel's zeros let the model run to the end"
    assert report["trace"]["decode_steps"] == 3


@pytest.mark.slow
def test_the_compile_check_reports_graphs_breaks_and_the_compile_time():
    report = run_coverage(model_config("qwen3-dense"), dtype="fp32", decode_steps=1)
    compiled = report["compile"]
    assert compiled["checked"] and compiled["backend"] == "aot_eager" and "inductor" in compiled["note"]
    assert compiled["explain"]["graph_count"] >= 1
    assert compiled["explain"]["graph_break_count"] == len(compiled["explain"]["break_reasons"])
    assert compiled["compiles"] and compiled["seconds"] > 0
    assert compiled["max_abs_difference_to_eager"] < 1e-3


def test_the_compile_check_can_be_turned_off_with_the_reason_recorded(reports):
    assert reports["mixtral"]["compile"] == {"checked": False, "reason": "compile check turned off (--no-compile)"}


def test_an_unknown_model_type_is_resolved_like_intake_resolves_it_or_built_generic_and_said_so():
    assert type(load_config(json.loads((CONFIGS / "kimi-k2-instruct.json").read_text()))).__name__ == \
        "DeepseekV3Config"
    for name in sorted(GENERIC):
        reduction = reduce_config(json.loads((CONFIGS / name).read_text()))
        assert reduction.notes[0].startswith("generic architecture: the release's own modeling code was not run")
    grok = reduce_config(json.loads((CONFIGS / "grok-1.json").read_text()))
    assert "keys not interpreted: attn_output_multiplier" in grok.notes[0]
    arctic = reduce_config(json.loads((CONFIGS / "snowflake-arctic-instruct.json").read_text()))
    assert "Qwen2-MoE-shaped decoder (routed experts and a shared expert)" in arctic.notes[0]  # its residual MLP
    minimax = reduce_config(json.loads((CONFIGS / "minimax-m1.json").read_text()))
    assert "MiniMax-shaped decoder (lightning attention in the linear-attention layers" in minimax.notes[0]


def test_the_op_coverage_stage_returns_one_report_per_dtype_and_reports_progress():
    fractions = []
    result = op_coverage({"config": model_config("qwen3-dense"), "dtypes": ["bf16", "fp32"], "compile": False,
                          "decode_steps": 1}, lambda fraction, message: fractions.append(fraction))
    assert set(result["reports"]) == {"bf16", "fp32"} and result["coverage"] == 1.0
    assert result["reports"]["fp32"]["dtype"] == "fp32"
    assert fractions == sorted(fractions) and fractions[-1] < 1
    with pytest.raises(ValueError, match="dtypes\\[0\\]: must be one of bf16, fp16, fp32, not 'fp7'"):
        op_coverage({"config": model_config("qwen3-dense"), "dtypes": ["fp7"]}, lambda *_: None)


@pytest.mark.slow
def test_the_coverage_command_prints_json_on_a_node_without_django(tmp_path):
    operators = tmp_path / "vendor.json"
    operators.write_text(json.dumps(["aten::mm", "aten::embedding"]))
    code = WITHOUT_DJANGO + "import runpy; runpy.run_module('workers.engine', run_name='__main__')"
    command = [sys.executable, "-c", code, "coverage", str(CONFIGS / MODELS["mixtral"]), "--json", "--dtype", "fp32",
               "--decode-steps", "1", "--no-compile", "--backend-list", str(operators)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert REPORT_KEYS <= set(report)
    assert report["backend"]["name"] == "virtual:vendor" and report["dtype"] == "fp32"
    assert by_name(report)["aten::mm.default"]["status"] == "native"
    assert 0 < report["coverage"] < 1 and report["module_classes_match"] is True
