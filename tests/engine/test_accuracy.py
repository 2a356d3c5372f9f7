"""The accuracy gate (workers/engine/serving/accuracy.py): lm-evaluation-harness against a served OpenAI-compatible
endpoint and against the transformers reference, on d0's own local task, and the gate's decision."""

import json
import shutil

import pytest

from workers.engine.serving.accuracy import (
    ACCURACY_TASK,
    SHIPPED_TASKS,
    gate,
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


# The real run (vLLM's CPU build serving the demo model, lm-eval against it and against the float32 reference, the
# gate both ways) is tests/test_serving_real_weights.py's, within a serve sweep: one engine start serves both.
