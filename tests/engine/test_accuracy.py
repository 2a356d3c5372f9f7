"""The accuracy gate (workers/engine/serving/accuracy.py): lm-evaluation-harness against a served OpenAI-compatible
endpoint and against the transformers reference, on d0's own local task, and the gate's decision."""

import json
import shutil

import pytest

from workers.engine.serving.accuracy import (
    ACCURACY_TASK,
    CHAT_TASK,
    PERPLEXITY_TASK,
    SHIPPED_TASKS,
    evaluate_endpoint,
    evaluate_reference,
    gate,
    perplexity_change,
    sandbox_templates,
    task_config,
    wilson_lower,
)

# Wilson score intervals' lower ends as tables give them (z = 1.96), e.g. Newcombe (1998), Table I.
WILSON_LOWER = [((8, 10), 0.4902), ((50, 100), 0.4038), ((10, 10), 0.7225), ((0, 10), 0.0), ((81, 263), 0.2553)]


@pytest.mark.parametrize(("counts", "expected"), WILSON_LOWER)
def test_the_wilson_lower_bound_is_the_tabulated_one(counts, expected):
    assert wilson_lower(*counts) == pytest.approx(expected, abs=5e-5)


def test_the_wilson_lower_bound_of_no_items_is_zero():
    assert wilson_lower(0, 0) == 0.0


def test_the_gate_holds_the_served_lower_bound_to_the_reference_less_the_allowed_drop():
    served = {"accuracy": 0.85, "wilson_lower_95": 0.78}
    passed = gate(served, {"accuracy": 0.86}, max_drop_points=10)
    assert passed == {"passed": True, "served_wilson_lower": 0.78, "reference_accuracy": 0.86, "max_drop_points": 10,
                      "reference_source": "measured",
                      "rule": "served Wilson 95% lower bound 78.0% >= measured reference 86.0% - 10 points = 76.0%: "
                              "passed"}
    failed = gate(served, 0.9, max_drop_points=5)
    assert not failed["passed"] and failed["reference_source"] == "published"
    assert failed["rule"] == ("served Wilson 95% lower bound 78.0% < published reference 90.0% - 5 points = 85.0%: "
                              "failed")
    with pytest.raises(ValueError, match="fraction"):
        gate(served, 86.0, max_drop_points=5)


def test_a_team_task_folder_reads_its_data_next_to_its_yaml_and_runs_no_code(tmp_path):
    team_tasks = tmp_path / "data-root" / "team-tasks"
    shutil.copytree(SHIPPED_TASKS, team_tasks)
    _, config = task_config(team_tasks, ACCURACY_TASK)
    assert config["dataset_kwargs"]["data_files"] == {"test": str(team_tasks / "basic_facts.jsonl")}
    with pytest.raises(ValueError, match="no task 'hellaswag'"):
        task_config(team_tasks, "hellaswag")  # lm-eval's own tasks are not offered
    (team_tasks / "d0_basic_facts.yaml").write_text(
        (team_tasks / "d0_basic_facts.yaml").read_text() + "process_docs: !function utils.process_docs\n")
    with pytest.raises(ValueError, match="!function"):
        task_config(team_tasks, ACCURACY_TASK)


def test_task_templates_render_in_a_sandbox():
    from jinja2.exceptions import SecurityError
    from lm_eval.utils import apply_template

    sandbox_templates()
    assert apply_template("Question: {{question}}\nAnswer:", {"question": "Why?"}) == "Question: Why?\nAnswer:"
    with pytest.raises(SecurityError):
        apply_template("{{ cycler.__init__.__globals__.os.getcwd() }}", {})


def test_a_logged_sample_is_reported_as_its_question_target_and_chosen_answer():
    from lm_eval.models.api_models import JsonChatStr

    from workers.engine.serving.accuracy import _sample

    question = "Question: What is the opposite of hot?\nAnswer:"
    multiple_choice = {"doc_id": 0, "target": 1, "acc": 0.0, "arguments": [(question, " soft"), (question, " cold")],
                       "filtered_resps": [(-1.5, True), (-2.0, False)]}
    assert _sample(multiple_choice, "acc") == {"doc_id": 0, "prompt": question, "target": "cold", "chosen": "soft",
                                               "correct": False}
    conversation = JsonChatStr(json.dumps([{"role": "user", "content": "What is the capital of France?"}]))
    chat = {"doc_id": 3, "target": "Paris", "exact_match": 1.0, "arguments": [(conversation, {"until": ["\n"]})],
            "filtered_resps": ["Paris"]}
    assert _sample(chat, "exact_match") == {"doc_id": 3, "prompt": "What is the capital of France?",
                                            "target": "Paris", "chosen": "Paris", "correct": True}


def test_the_shipped_task_has_at_least_a_hundred_four_choice_items():
    rows = [json.loads(line) for line in (SHIPPED_TASKS / "basic_facts.jsonl").read_text().splitlines()]
    assert len(rows) >= 100
    assert all(len(row["choices"]) == 4 and 0 <= row["answer"] < 4 for row in rows)


@pytest.mark.slow
@pytest.mark.timeout(20 * 60)
def test_the_served_demo_model_is_as_accurate_as_its_reference_and_the_gate_decides(vllm_python, demo_checkpoint,
                                                                                     tmp_path):
    """vLLM's CPU build serves the demo model (bfloat16); lm-eval scores the shipped tasks through its completions
    API (and the chat task through its chat API) and on the float32 transformers reference. One engine start."""
    from workers.engine.serving.launchers import VllmLauncher
    from workers.engine.serving.server import EngineServer, free_port

    port = free_port()
    launch = VllmLauncher.launch(vllm_python, demo_checkpoint, {"gpu_memory_utilization": 0.1, "kv_cache_space_gib": 1,
                                                                "max_model_len": 1024, "enforce_eager": True},
                                 port=port, cpu_build=True)
    # the engine core in the API server's process: one process start less, nothing else changes
    with EngineServer(launch.command, env={**launch.env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, port=port,
                      log_path=tmp_path / "engine.log") as server:
        server.wait_healthy(600)
        served = evaluate_endpoint(server.base_url, "d0", demo_checkpoint, SHIPPED_TASKS, ACCURACY_TASK)
        served_text = evaluate_endpoint(server.base_url, "d0", demo_checkpoint, SHIPPED_TASKS, PERPLEXITY_TASK)
        served_chat = evaluate_endpoint(server.base_url, "d0", demo_checkpoint, SHIPPED_TASKS, CHAT_TASK,
                                        api="chat-completions")
    reference = evaluate_reference(demo_checkpoint, SHIPPED_TASKS, ACCURACY_TASK)
    reference_text = evaluate_reference(demo_checkpoint, SHIPPED_TASKS, PERPLEXITY_TASK)
    print(json.dumps({"served": {k: v for k, v in served.items() if k != "samples"},
                      "reference": {k: v for k, v in reference.items() if k != "samples"},
                      "perplexity": perplexity_change(served_text, reference_text)}))

    assert served["harness"] == "lm-eval 0.4.13 local-completions" and reference["harness"] == "lm-eval 0.4.13 hf"
    for result in (served, reference):
        assert result["n"] == len(result["samples"]) >= 100 and result["metric"] == "acc"
        assert result["correct"] == sum(sample["correct"] for sample in result["samples"])
        assert result["accuracy"] == pytest.approx(result["correct"] / result["n"], abs=1e-6)
        assert result["wilson_lower_95"] < result["accuracy"] and 0 < result["stderr"] < 0.1
        # four choices: chance is 25%
        assert result["accuracy"] > 0.6
    first = served["samples"][0]
    assert first == {"doc_id": 0, "prompt": "Question: What is the opposite of hot?\nAnswer:", "target": "cold",
                     "chosen": first["chosen"], "correct": first["chosen"] == "cold"}
    assert served_chat["harness"] == "lm-eval 0.4.13 local-chat-completions" and served_chat["n"] == 27
    assert served_chat["metric"] == "exact_match" and served_chat["accuracy"] > 0.6
    assert served_chat["samples"][0]["prompt"] == "What is the capital of France? Answer with one word."
    # the engine's bfloat16 against the float32 reference: an item or two may flip, no more
    assert abs(served["accuracy"] - reference["accuracy"]) <= 0.03
    assert abs(perplexity_change(served_text, reference_text)["relative"]) < 0.05

    decided = gate(served, reference, max_drop_points=10)
    assert decided["passed"] and decided["reference_source"] == "measured", decided["rule"]
    # a published score the served model does not reach, and no drop allowed from the measured one
    assert not gate(served, 0.98, max_drop_points=5)["passed"]
    assert not gate(served, reference, max_drop_points=0)["passed"]
