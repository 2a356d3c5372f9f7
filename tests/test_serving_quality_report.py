"""The engine report's "Validated against the reference" section, its Variants table and quality-against-speed
chart, the trials' quality statuses and the job's headline, from serve sweep results as a node stores them
(``serving.quality``): on real weights with three numerics (one passes, one keeps too little of the unquantized
accuracy, one fails its answers), and on random weights. The results are the node's word: hostile strings are
escaped, and the chart draws only numbers."""

import json

import pytest
from django.test import Client

from adaptation.models import StageRun
from adaptation.serving.services import validation

from .test_trial_row import stored_serve_sweep

HOSTILE = "<script>alert(1)</script>"
LIMITS = {"top1_agreement": 0.95, "mean_abs_logprob": 0.05, "max_abs_logprob": 0.5, "mean_topk_kl": 0.02}


def answers(top1: float, diverging: int = 0) -> dict:
    per_prompt = [{"prompt": "capital", "first_divergence": None}]
    if diverging:
        per_prompt.insert(0, {"prompt": "arithmetic", "first_divergence": 2, "reference_answer": "12 plus 7 is 19.",
                              "engine_answer": "12 plus 7 is 21.", "reference_margin": 1.75})
    return {"tokens_compared": 80, "top1_agreement": top1, "mean_abs_logprob": 0.014, "max_abs_logprob": 0.072,
            "mean_topk_kl": 0.0016, "max_topk_kl": 0.004, "prompts_diverging": diverging, "per_prompt": per_prompt}


def lm_eval(accuracy: float, wilson: float, samples=()) -> dict:
    return {"accuracy": accuracy, "source": "measured", "n": 200, "stderr": 0.034, "wilson_lower_95": wilson,
            "task": "d0_facts", "harness": "lm-eval 0.4.9", "seconds": 12.0,
            "samples": [{"doc_id": doc_id, "prompt": prompt, "target": "Paris", "chosen": chosen, "correct": correct}
                        for doc_id, prompt, chosen, correct in samples]}


def entry(variant, label, verdict, reasons, correctness, accuracy, **more) -> dict:
    return {"numerics": {"variant": variant, "dtype": "bfloat16"}, "label": label, "verdict": verdict,
            "reasons": reasons, "correctness": correctness, "accuracy": accuracy, **more,
            "variant": None if variant == "as_shipped" else {
                "name": variant, "bits": 8 if "8" in variant else 4, "method": "round to nearest", "threshold": 0.95,
                "made_by": "llmcompressor", "disk_bytes": 150_000_000, "path": f"/cache/{variant}"}}


def real_weights_result() -> dict:
    """A real-weights serve sweep: as shipped passes; w8a8-int8 answers well but keeps 90% of the accuracy
    (threshold 95%: under-recovery); w4a16's chat template differs and its answers leave the reference's (a
    hostile label and reason, as a node could send them)."""
    passing = {"verdict": "pass", "reasons": [], "precision_class": "16-bit", "thresholds": LIMITS,
               "parity": {"equal": True, "prompts": 5, "mismatches": []},
               "single": answers(1.0), "batched": answers(0.9875), "weights_versus_reference": None}
    broken = {**passing, "verdict": "fail", "precision_class": "4-bit",
              "reasons": [f"chat template parity: prompt 'system' differs {HOSTILE}", "answers (single): top-1 0.6"],
              "parity": {"equal": False, "prompts": 5, "mismatches": [
                  {"prompt": "system", "position": 3, "reference_tokens": 40, "engine_tokens": 38,
                   "reference_text": "<|im_start|>system", "engine_text": "<|im_start|>user"}]},
              "single": answers(0.6, diverging=1), "batched": answers(0.55, diverging=1),
              "weights_versus_reference": {"compared": 272, "differing_count": 1, "differing": [
                  {"name": "model.embed_tokens.weight", "max_abs_difference": 0.5, "reference_max_abs": 1.0}]}}
    broken["first_diverging_prompt"] = broken["single"]["per_prompt"][0]
    shipped_accuracy = lm_eval(0.62, 0.55, [(0, "Capital of France?", "Paris", True),
                                            (1, "Capital of Peru?", "Quito", False)])
    entries = [
        entry("as_shipped", "as shipped, dtype bfloat16", "pass", [], passing, shipped_accuracy,
              gate={"passed": True, "rule": "served Wilson lower bound 0.550 >= reference 0.630 - 10 points",
                    "served_wilson_lower": 0.55, "reference_accuracy": 0.63, "max_drop_points": 10.0,
                    "reference_source": "measured"},
              perplexity={"word_perplexity": 21.5}),
        entry("w8a8-int8", "w8a8-int8, dtype bfloat16", "under-recovery",
              ["w8a8-int8, dtype bfloat16 keeps 90.3% of as shipped's accuracy; its threshold is 95%"],
              {**passing, "precision_class": "8-bit"}, lm_eval(0.56, 0.49),
              recovery={"accuracy_pct": 90.3, "threshold_pct": 95.0, "passed": False, "against":
                        "as shipped, dtype bfloat16", "rule": "w8a8-int8 keeps 90.3%; its threshold is 95%",
                        "delta_perplexity": 1.2, "top1_agreement": 1.0}),
        entry("w4a16", f"w4a16 {HOSTILE}", "failed-correctness", broken["reasons"], broken, lm_eval(0.3, 0.24)),
    ]
    rows = [{"label": item["label"], "numerics": item["numerics"], "bits": (item["variant"] or {}).get("bits"),
             "method": (item["variant"] or {}).get("method"), "disk_bytes": (item["variant"] or {}).get("disk_bytes"),
             "output_tokens_per_s": speed, "peak_memory_bytes": 2**30, "accuracy": item["accuracy"]["accuracy"],
             "word_perplexity": None, "top1_agreement": item["correctness"]["single"]["top1_agreement"],
             "recovery": item.get("recovery"), "verdict": item["verdict"], "reasons": item["reasons"],
             "recommended": item["verdict"] == "pass"}
            for item, speed in zip(entries, (431.25, 520.0, 610.0), strict=True)]
    rows.append({**rows[0], "label": "odd row", "output_tokens_per_s": "fast", "accuracy": HOSTILE})
    stored = stored_serve_sweep()
    served = stored["trials"][1]
    stored["weights"] = {"kind": "checkpoint", "path": "/models/smollm2", "real": True,
                         "description": "d0's demo model, SmolLM2-135M-Instruct with its real weights"}
    stored["trials"] += [{**served, "id": 2, "settings": {"max_num_seqs": 4, "variant": "w4a16"},
                          "status": "failed-correctness", "reason": "; ".join(broken["reasons"]),
                          "quality": {"verdict": "failed-correctness", "label": f"w4a16 {HOSTILE}"}}]
    stored["trials"][1]["quality"] = {"verdict": "pass", "label": "as shipped, dtype bfloat16"}
    reference = {"implementation": "transformers", "dtype": "float32", "checkpoint": "/models/smollm2", "tokens": 16,
                 "top_k": 5, "seconds": 9.5,
                 "prompts": [{"name": "capital", "prompt_tokens": 31, "answer": "The capital of France is Paris."}],
                 "accuracy": lm_eval(0.63, 0.56, [(0, "Capital of France?", "Paris", True),
                                                  (1, "Capital of Peru?", "Lima", True)])}
    stored["quality"] = {"reference": reference, "entries": entries,
                         "accuracy": {"task_dir": "/tasks", "task": "d0_facts", "perplexity_task": "d0_wiki",
                                      "max_drop_points": 10.0, "published": None}}
    stored["variants"] = rows
    stored["correctness"] = {**passing, "kind": "real weights", "numerics": "as shipped, dtype bfloat16",
                             "reference": reference}
    return stored


@pytest.fixture
def member_client(member):
    client = Client()
    client.force_login(member)
    return client


def engine_run(job, node, stored) -> StageRun:
    return StageRun.objects.create(job=job, kind="serve_sweep", node=node, node_name=node.hostname,
                                   status="succeeded", result=stored)


def test_a_real_weights_report_shows_each_numerics_checked_against_the_reference(job, node, member_client):
    run = engine_run(job, node, real_weights_result())
    page = member_client.get(f"/engines/{run.pk}/").content.decode()
    section = page[page.index('<h2 id="validated">'):page.index("<h2>Trials</h2>")]
    # The facts' Correctness row names the recipe's numerics and links the section
    assert "pass:\n    as shipped, dtype bfloat16 against transformers in float32" in page
    assert "top-1 agreement 1.000 alone and 0.988 batched" in page
    # Per numerics: the verdict, parity with its first mismatch side by side, both passes against their limits
    assert "as shipped, dtype bfloat16 (the recipe's numerics)" in section
    assert '<span class="verdict bad">failed-correctness</span>' in section
    assert "the engine's tokens equal the reference's\n    on all 5 prompts" in section
    assert "First mismatch: prompt system, at token 3" in section
    assert "<td><pre>&lt;|im_start|&gt;system</pre></td><td><pre>&lt;|im_start|&gt;user</pre></td>" in section
    assert '<td class="flag">0.6000</td>' in section and "<td>≥ 0.95</td>" in section
    assert "<td><pre>12 plus 7 is 19.</pre></td><td><pre>12 plus 7 is 21.</pre></td>" in section
    assert "model.embed_tokens.weight" in section and "1\n    of 272 tensors differ" in section
    # The accuracy gate, the recovery under its threshold, perplexity, and the samples of both sides
    assert "served\n    62.0% ± 3.4% over 200 items,\n    Wilson lower bound (95%) 55.0%" in section
    assert "the reference\n    63.0% ± 3.4%, Wilson lower bound\n    56.0%" in section
    assert "Accuracy gate passed:\n    served Wilson lower bound 0.550 &gt;= reference 0.630 - 10 points" in section
    assert '<p class="recovery flag">' in section and "Δ word perplexity 1.200" in section
    assert "Word perplexity: 21.500" in section
    assert "<td>Lima ✓</td>\n      <td class=\"flag\">Quito ✗</td>" in section
    # The variants: numbered as the chart's points, the failed ones not recommended with their reasons
    assert section.count('<tr class="not-recommended">') == 2
    assert "90.3%</span>\n      <small>(threshold 95% of as shipped, dtype bfloat16)</small>" in section
    assert 'data-chart="quality-against-speed"' in section
    # The trials: the failed numerics' trial marked, its reason and numerics shown
    trials = page[page.index("<h2>Trials</h2>"):]
    assert 'title="its numerics failed a check against the reference' in trials and "<th" in trials
    assert ">failed-correctness</span> <small>chat template parity" in trials
    assert "<td>as shipped, dtype bfloat16</td>" in trials


def test_the_quality_chart_draws_only_numbers_with_the_thresholds(job, node):
    from adaptation.serving.charts import quality_chart_data

    figure = quality_chart_data(validation(real_weights_result()))["quality-against-speed"]
    points = {trace["name"]: trace for trace in figure["data"]}
    assert points["recommended"]["x"] == [431.25] and points["recommended"]["y"] == [62.0]
    assert points["not recommended (failed a check)"]["text"] == ["#2", "#3"]
    assert points["recovery threshold"]["y"] == pytest.approx([62.0 * 0.95])
    assert [round(y, 6) for y in points["gate: the reference − 10 points (the Wilson lower bound must reach it)"]
            ["y"]] == [53.0, 53.0]
    # Every drawn value is a number, every text the control plane's own ("odd row" sent strings: not drawn)
    for trace in figure["data"]:
        assert all(isinstance(value, int | float) for value in [*trace["x"], *trace["y"]])
        assert all(text.startswith("#") for text in trace.get("text") or [])
    assert HOSTILE not in json.dumps(figure) and "odd row" not in json.dumps(figure)


def test_a_nodes_strings_are_escaped_everywhere_on_the_page(job, node, member_client):
    stored = real_weights_result()
    stored["quality"]["reference"]["checkpoint"] = HOSTILE
    stored["quality"]["entries"][0]["correctness"]["parity"] = HOSTILE
    stored["quality"]["entries"][1]["accuracy"]["samples"] = [{"doc_id": HOSTILE, "prompt": HOSTILE, "chosen": 3}]
    run = engine_run(job, node, stored)
    page = member_client.get(f"/engines/{run.pk}/").content.decode()
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_random_weights_report_says_it_checked_no_accuracy_and_the_headline_warns(job, node, member_client):
    from adaptation.serving.stage import ServeSweep

    stored = {**stored_serve_sweep(), "quality": {"note": "no accuracy check: random weights"}, "variants": [],
              "correctness": {"verdict": "agree", "dtype": "float32", "tokens": 8,
                              "versus_transformers": {"prompts": 2, "prompts_agreeing": 2,
                                                      "max_logprob_difference": 1e-5}}}
    page = member_client.get(f"/engines/{engine_run(job, node, stored).pk}/").content.decode()
    assert "no accuracy check: random weights" in page and 'id="variants"' not in page
    assert "agree:\n    2 of 2 prompts give transformers' greedy tokens" in page
    outcome = ServeSweep().outcome(stored)
    assert "no accuracy check: random weights" in outcome.warnings
    assert any("validation checkpoint" in warning for warning in outcome.warnings)
    assert not any(warning.startswith("correctness") for warning in outcome.warnings)


def test_the_headline_names_the_numerics_chosen_and_its_accuracy_against_the_reference():
    from adaptation.serving.stage import ServeSweep

    outcome = ServeSweep().outcome(real_weights_result())
    assert ("serving as shipped, dtype bfloat16 (accuracy 62.0% against the reference's 63.0%, gate passed)"
            in outcome.summary)
    assert not any("correctness" in warning or "random" in warning for warning in outcome.warnings)
