"""Is the engine's output right? Greedy tokens and their logprobs of the engine at the chosen layout, against the
same engine at TP=1 (when the layout splits the model) and against transformers' reference on the same checkpoint.

All three run in float32: random weights give nearly flat logits, and bfloat16 rounding alone would flip
near-tied greedy choices between two correct implementations. The report says which prompts agree, the first
position where one diverges, and the largest logprob difference over the tokens they share.
"""

from __future__ import annotations

import random
from pathlib import Path

from .client import Endpoint, greedy
from .launchers import LAYOUT_KEYS, layout_of
from .server import EngineFailed

PROMPTS = 3
PROMPT_TOKENS = 8
DTYPE = "float32"


def prompts(vocab: int, count: int = PROMPTS, length: int = PROMPT_TOKENS, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids from 3 up: the generated tokenizer's first three are <unk>, <s> and </s>.
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(count)]


def reference_greedy(checkpoint: Path, prompt_ids: list[list[int]], tokens: int) -> list[dict]:
    """transformers' greedy tokens and logprobs for each prompt (full forward each step: exact, and the models are
    small)."""
    import torch

    from ..models.loading import load_checkpoint

    model = load_checkpoint(str(checkpoint), dtype=torch.float32)
    outputs = []
    with torch.inference_mode():
        for prompt in prompt_ids:
            ids = torch.tensor([prompt])
            token_ids, logprobs = [], []
            for _ in range(tokens):
                logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)
                token = int(logp.argmax())
                token_ids.append(token)
                logprobs.append(float(logp[token]))
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            outputs.append({"token_ids": token_ids, "logprobs": logprobs})
    return outputs


def compare(reference: list[dict], other: list[dict]) -> dict:
    agree, first_divergence, max_diff = 0, None, 0.0
    for index, (a, b) in enumerate(zip(reference, other, strict=True)):
        same = 0
        for x, y in zip(a["token_ids"], b["token_ids"], strict=False):
            if x != y:
                break
            same += 1
        if same == len(a["token_ids"]) == len(b["token_ids"]):
            agree += 1
        elif first_divergence is None:
            first_divergence = {"prompt": index, "position": same}
        if a.get("logprobs") and b.get("logprobs"):
            max_diff = max([max_diff, *(abs(x - y) for x, y in zip(a["logprobs"][:same], b["logprobs"][:same],
                                                                   strict=True))])
    return {"prompts": len(reference), "prompts_agreeing": agree, "tokens_equal": agree == len(reference),
            "first_divergence": first_divergence, "max_logprob_difference": max_diff}


def _engine_greedy(session, settings: dict, prompt_ids, tokens: int, startup_timeout_s: float) -> dict:
    server, launch = session.server({**settings, "dtype": DTYPE})
    with server:
        server.wait_healthy(startup_timeout_s)
        outputs = greedy(Endpoint(server.base_url, "d0"), prompt_ids, tokens)
    return {"command": launch.shell(), "outputs": outputs}


def check_correctness(session, settings: dict, *, vocab: int, tokens: int, startup_timeout_s: float) -> dict:
    prompt_ids = prompts(vocab)
    layout = layout_of(settings)
    split = settings.get("tensor_parallel_size", 1) * settings.get("pipeline_parallel_size", 1) > 1
    report = {"dtype": DTYPE, "prompts": prompt_ids, "tokens": tokens, "layout": layout}
    try:
        chosen = _engine_greedy(session, settings, prompt_ids, tokens, startup_timeout_s)
        report["engine"] = chosen
        if split:
            single = {key: value for key, value in settings.items() if key not in LAYOUT_KEYS}
            report["engine_tp1"] = _engine_greedy(session, single, prompt_ids, tokens, startup_timeout_s)
            report["versus_engine_tp1"] = compare(report["engine_tp1"]["outputs"], chosen["outputs"])
    except EngineFailed as error:
        return {**report, "verdict": "failed", "reason": str(error)}
    report["reference"] = {"implementation": "transformers", "outputs": reference_greedy(
        session.checkpoint, prompt_ids, tokens)}
    report["versus_transformers"] = compare(report["reference"]["outputs"], chosen["outputs"])
    agreeing = report["versus_transformers"]["tokens_equal"] and (
        not split or report["versus_engine_tp1"]["tokens_equal"])
    report["verdict"] = "agree" if agreeing else "disagree"
    return report
