"""Accuracy of a served model against its reference, measured with EleutherAI's lm-evaluation-harness: the same
task, read from local files only, run against the engine's OpenAI-compatible API (``evaluate_endpoint``) and
against the checkpoint in transformers, float32 on the CPU (``evaluate_reference``); ``gate`` decides whether the
served accuracy is close enough.

A task is a folder of lm-eval task YAMLs with their data next to them (d0 ships ``tasks/d0_basic``; a team's own
folder lies under the node's data roots). ``dataset_kwargs.data_files`` paths that are relative are read relative
to the YAML's folder (lm-eval itself reads them relative to the working directory). Task folders are data: a YAML
with ``!function`` (Python that lm-eval would import from the folder) is refused, and templates render in jinja2's
sandbox.

lm-eval is imported inside the functions: it takes seconds to import, and only this stage needs it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

LM_EVAL_VERSION = "0.4.13"
# d0's own tasks: multiple choice (accuracy, completions API), short answers (accuracy, chat API) and a text
# (perplexity, completions API).
SHIPPED_TASKS = Path(__file__).parent / "tasks" / "d0_basic"
ACCURACY_TASK = "d0_basic_facts"
CHAT_TASK = "d0_basic_chat"
PERPLEXITY_TASK = "d0_text_perplexity"
# The context both sides score in: the served engine's max_model_len or less (a completion with echo needs the
# whole prompt in the engine's window).
MAX_LENGTH = 1024
# Items the report keeps the prompt of, and how much of it: samples are for reading a few, not a second dataset.
PROMPT_CHARS = 120
REFERENCE_BATCH = 16
# Requests of the served side: prompts per completions request and such requests in flight (few large requests
# beat many small ones: 112 items took 6-10 s at 32 x 2, 18 s at 8 x 4 on a busy 2-core machine); a chat request
# carries one conversation, so more of them are in flight.
ENDPOINT_BATCH = 32
ENDPOINT_CONCURRENCY = 2
CHAT_CONCURRENCY = 8
PERPLEXITY_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# The gate's X: with the shipped task's 112 items, a served accuracy equal to a reference's 0.875 has a Wilson lower
# bound 7.4 points under it, so the gate allows 10 points by default (a team with a larger task can ask for less).
DEFAULT_MAX_DROP_POINTS = 10.0


def check_published(value) -> dict:
    """A published reference score a team enters instead of evaluating the reference: ``{"accuracy": fraction,
    "source": text}``."""
    if not isinstance(value, dict) or set(value) - {"accuracy", "source"}:
        raise ValueError('a published reference is {"accuracy": 0.62, "source": "where it is published"}')
    accuracy = value.get("accuracy")
    if isinstance(accuracy, bool) or not isinstance(accuracy, int | float) or not 0 <= accuracy <= 1:
        raise ValueError(f"a published reference accuracy is a fraction in [0, 1], not {accuracy!r}")
    source = value.get("source", "")
    if not isinstance(source, str) or len(source) > 200:
        raise ValueError("a published reference's source is a text of at most 200 characters")
    return value


def wilson_lower(correct: int, n: int, z: float = 1.96) -> float:
    """The lower end of the Wilson score interval for ``correct`` of ``n`` (Wilson 1927): unlike the normal
    approximation it stays inside [0, 1] and is honest for small ``n`` and for accuracies near 0 or 1."""
    if n <= 0:
        return 0.0
    p = correct / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, (centre - margin) / (1 + z2 / n))


def evaluate_endpoint(base_url: str, model: str, tokenizer: Path, task_dir: Path, task: str, *,
                      api: str = "completions", api_key: str | None = None, max_length: int = MAX_LENGTH) -> dict:
    """``task`` against an OpenAI-compatible server at ``base_url`` serving ``model``. ``api``: "completions"
    (lm-eval's local-completions: loglikelihoods from echoed prompt logprobs, which multiple-choice and perplexity
    tasks need) or "chat-completions" (local-chat-completions, for generate_until tasks, with the chat template).
    ``tokenizer``: the served model's tokenizer folder (lm-eval counts context tokens with it)."""
    if api not in ("completions", "chat-completions"):
        raise ValueError(f"api must be 'completions' or 'chat-completions', not {api!r}")
    model_type = "local-" + api
    route = {"completions": "completions", "chat-completions": "chat/completions"}[api]
    arguments = {"model": model, "base_url": f"{base_url.rstrip('/')}/v1/{route}", "tokenizer": str(tokenizer),
                 "tokenizer_backend": "huggingface", "max_length": max_length, "max_retries": 1,
                 "timeout": 120}
    if api == "completions":
        arguments.update(tokenized_requests=True, batch_size=ENDPOINT_BATCH, num_concurrent=ENDPOINT_CONCURRENCY)
    else:
        arguments.update(tokenized_requests=False, batch_size=1, num_concurrent=CHAT_CONCURRENCY)
    if api_key:
        arguments["header"] = {"Authorization": f"Bearer {api_key}"}
    return _evaluate(model_type, arguments, task_dir, task, chat=api == "chat-completions")


def evaluate_reference(checkpoint: Path, task_dir: Path, task: str, *, chat: bool = False,
                       max_length: int = MAX_LENGTH) -> dict:
    """``task`` on the checkpoint in transformers (lm-eval's ``hf`` model), float32 on the CPU: the reference a
    served variant is held to. ``chat``: prompts through the checkpoint's chat template, as the served side's
    chat-completions API applies it."""
    arguments = {"pretrained": str(checkpoint), "dtype": "float32", "device": "cpu", "batch_size": REFERENCE_BATCH,
                 "max_length": max_length}
    return _evaluate("hf", arguments, task_dir, task, chat=chat)


def gate(served: dict, reference: dict | float, max_drop_points: float) -> dict:
    """Whether the served accuracy holds: its Wilson 95% lower bound is at least the reference's accuracy less
    ``max_drop_points`` (percentage points). ``reference``: a measured result (``evaluate_reference``) or a
    published accuracy (a fraction in [0, 1]) a team entered instead."""
    if isinstance(reference, dict):
        reference_accuracy, source = float(reference["accuracy"]), "measured"
    else:
        reference_accuracy, source = float(reference), "published"
        if not 0.0 <= reference_accuracy <= 1.0:
            raise ValueError(f"a published reference accuracy is a fraction in [0, 1], not {reference}")
    if max_drop_points < 0:
        raise ValueError(f"max_drop_points must be >= 0, not {max_drop_points}")
    lower = float(served["wilson_lower_95"])
    threshold = reference_accuracy - max_drop_points / 100
    passed = lower >= threshold - 1e-12
    rule = (f"served Wilson 95% lower bound {100 * lower:.1f}% {'>=' if passed else '<'} {source} reference "
            f"{100 * reference_accuracy:.1f}% - {max_drop_points:g} points = {100 * threshold:.1f}%: "
            f"{'passed' if passed else 'failed'}")
    return {"passed": passed, "rule": rule, "served_wilson_lower": round(lower, 6),
            "reference_accuracy": round(reference_accuracy, 6), "max_drop_points": max_drop_points,
            "reference_source": source}


def perplexity_change(served: dict, reference: dict) -> dict:
    """Δ word perplexity of a served variant against its reference on the same text (absolute and relative)."""
    delta = served["word_perplexity"] - reference["word_perplexity"]
    return {"served_word_perplexity": served["word_perplexity"],
            "reference_word_perplexity": reference["word_perplexity"],
            "delta": round(delta, 6), "relative": round(delta / reference["word_perplexity"], 6)}


def task_config(task_dir: Path, task: str):
    """lm-eval's TaskManager over ``task_dir`` (only: lm-eval's own thousands of tasks are neither indexed nor
    offered) and ``task``'s config, its relative data files made absolute."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    task_dir = Path(task_dir).resolve()
    for path in [*task_dir.rglob("*.yaml"), *task_dir.rglob("*.yml")]:
        if "!function" in path.read_text(errors="replace"):
            raise ValueError(f"{path} uses !function (Python from the task folder); d0 runs YAML and data only")
    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    entry = manager.task_index.get(task)
    if entry is None or entry.yaml_path is None or entry.kind.name != "TASK":
        raise ValueError(f"no task {task!r} in {task_dir} (its tasks: {', '.join(manager.all_subtasks) or 'none'})")
    config = load_yaml(entry.yaml_path, resolve_func=False)
    if "class" in config:
        raise ValueError(f"task {task!r} names a Python class; d0 runs YAML and data only")
    kwargs = config.get("dataset_kwargs") or {}
    if "data_files" in kwargs:
        config["dataset_kwargs"] = {**kwargs, "data_files": _absolute(kwargs["data_files"], entry.yaml_path.parent)}
    return manager, config


def sandbox_templates() -> None:
    """Render lm-eval's templates (a task's doc_to_text and the like, a remote tokenizer's chat template) in
    jinja2's sandbox: lm-eval renders them with a plain Environment, through which a template reaches Python (a
    team's task folder, an endpoint someone else runs)."""
    from jinja2 import BaseLoader, StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from lm_eval import utils

    if not isinstance(utils.env, ImmutableSandboxedEnvironment):
        sandbox = ImmutableSandboxedEnvironment(loader=BaseLoader, undefined=StrictUndefined,
                                                keep_trailing_newline=True)
        sandbox.filters.update(utils.env.filters)
        utils.env = sandbox


def _absolute(files, folder: Path):
    if isinstance(files, dict):
        return {split: _absolute(value, folder) for split, value in files.items()}
    if isinstance(files, (list, tuple)):
        return [_absolute(value, folder) for value in files]
    return str(folder / files) if "://" not in str(files) else files


def _evaluate(model_type: str, arguments: dict, task_dir: Path, task: str, *, chat: bool) -> dict:
    # before datasets is imported (it reads them once): tasks come from local files, never from the hub
    os.environ.update(OFFLINE)
    from lm_eval import evaluator

    sandbox_templates()
    manager, config = task_config(task_dir, task)
    started = time.perf_counter()
    output = evaluator.simple_evaluate(model=model_type, model_args=arguments, tasks=[config], task_manager=manager,
                                       log_samples=True, apply_chat_template=chat, bootstrap_iters=1000,
                                       random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                       fewshot_random_seed=0)
    seconds = time.perf_counter() - started
    metrics = output["results"][task]
    samples = output["samples"][task]
    result = {"task": task, "harness": f"lm-eval {LM_EVAL_VERSION} {model_type}", "n": len(samples),
              "seconds": round(seconds, 2)}
    if config.get("output_type") == "loglikelihood_rolling":
        for name in PERPLEXITY_METRICS:
            result[name] = round(float(metrics[f"{name},none"]), 6)
        return result
    metric = _metric_of(metrics)
    scored = [_sample(sample, metric) for sample in sorted(samples, key=lambda sample: sample["doc_id"])]
    correct = sum(sample["correct"] for sample in scored)
    stderr = metrics.get(f"{metric}_stderr,none")
    result.update(metric=metric, accuracy=round(float(metrics[f"{metric},none"]), 6),
                  stderr=round(float(stderr), 6) if isinstance(stderr, (int, float)) else None,
                  correct=correct, wilson_lower_95=round(wilson_lower(correct, len(scored)), 6), samples=scored)
    return result


def _metric_of(metrics: dict) -> str:
    # acc where the task has it (multiple choice), else the task's first metric (exact_match for generate_until)
    names = [key.split(",")[0] for key in metrics if "," in key and "_stderr" not in key]
    return "acc" if "acc" in names else names[0]


def _sample(sample: dict, metric: str) -> dict:
    """One item of lm-eval's logged samples, small: the end of the prompt (the question), the target and the chosen
    answer as text, and whether it counted as correct."""
    arguments = sample["arguments"]
    prompt = arguments[0][0]
    # a chat request's prompt is the conversation as JSON (lm-eval's JsonChatStr): its last message is the question
    prompt = json.loads(prompt.prompt)[-1]["content"] if hasattr(prompt, "prompt") else str(prompt)
    if len(arguments) > 1:
        # multiple choice: one (context, continuation) request per choice; the chosen one has the highest
        # loglikelihood, as lm-eval's acc takes it
        likelihoods = [response[0] for response in sample["filtered_resps"]]
        chosen = str(arguments[max(range(len(likelihoods)), key=likelihoods.__getitem__)][1]).strip()
        target = sample["target"]
        target = str(arguments[target][1]).strip() if isinstance(target, int) else str(target)
    else:
        chosen = str(sample["filtered_resps"][0]).strip()
        target = str(sample["target"])
    return {"doc_id": sample["doc_id"], "prompt": prompt[-PROMPT_CHARS:], "target": target, "chosen": chosen,
            "correct": bool(sample[metric])}
