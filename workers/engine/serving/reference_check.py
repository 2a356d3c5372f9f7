"""Served vs reference on real weights: does the engine answer as the released model does?

Random weights cannot show that (their logits are nearly flat), nor can token-id prompts: day-zero releases break
first in the chat template and the tokenizer. So, on a checkpoint with real weights, each engine start is checked
against transformers in float32 on the release's own checkpoint (``reference``), with the same chat messages:

- *chat template parity*: the engine's tokens for the messages (vLLM's ``/tokenize`` with ``messages``) equal the
  reference tokenizer's ``apply_chat_template`` ids, special tokens included; a raw prompt's likewise;
- *answers*: the reference's greedy continuation of each prompt, then the engine's, alone (one request at a time)
  and batched (all at once): the first position where the engine's greedy tokens leave the reference's, and, fed
  the reference's continuation (``prompt_logprobs``, teacher-forced, so one near-tie does not derail the rest), its
  top-1 agreement, mean and max |Δ logprob| of the reference's tokens and the KL divergence over the reference's
  top-k. Limits per precision class (``THRESHOLDS``) are stated in the report.

The prompts are shorter and longer than a KV-cache block. Where the served checkpoint is not the reference's
folder (a converted or quantized copy), tensors both hold under the same name and shape are compared, so a weight
the engine is given differently is named.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from .client import Endpoint, _connector, http_error

TOKENS = 16
TOP_K = 5
LONG_PASSAGE = (
    "The river rises in the hills to the north, where the snow melts each spring and feeds a dozen small streams. "
    "They join above the old mill, and from there the river runs broad and slow through farmland for forty miles, "
    "past three villages and a market town, before it reaches the sea at a wide estuary where wading birds feed "
    "at low tide. In the last century the mill was turned into a museum, the villages grew into suburbs of the "
    "town, and a bridge with seven arches was built where the ferry used to cross. Fishermen still keep boats in "
    "the estuary, though fewer each year, and in summer visitors walk the towpath from the mill to the sea, which "
    "takes most of them two days. The town holds a fair each autumn on the meadow beside the bridge, with cattle, "
    "cider and a race of rowing boats from the bridge to the estuary and back.")
# Chat prompts (the release's template applies) and a raw one (the tokenizer alone); "long" is several KV-cache
# blocks of any size the engine takes, the others fit in one block of 64 tokens or more.
PROMPTS = (
    {"name": "capital", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "arithmetic", "messages": [{"role": "user", "content": "What is 12 plus 7? Answer with a number."}]},
    {"name": "system", "messages": [{"role": "system", "content": "You answer in one short sentence."},
                                    {"role": "user", "content": "Name three primary colours."}]},
    {"name": "long", "messages": [{"role": "user", "content": LONG_PASSAGE + "\n\nWhere does the river reach "
                                                                            "the sea, and what feeds it?"}]},
    {"name": "raw", "text": "The capital of France is"},
)
# Served precision class -> the limits the answers must keep against the float32 reference. float32 differs from
# it by kernel order only; 16-bit rounding moves logprobs by a few hundredths and flips near-ties; the quantized
# classes are judged again on task accuracy (recovery), so these only catch a broken engine or checkpoint.
# Measured on SmolLM2-135M-Instruct served by vLLM 0.32's CPU build (5 prompts x 16 tokens): float32 top-1 1.0,
# mean |Δ| 3e-6, max 2e-5, KL 3e-7; bfloat16 top-1 1.0, mean 0.014, max 0.072, KL 0.0016 (one greedy answer left the
# reference's at its first token, a near-tie 0.098 apart).
THRESHOLDS = {
    "float32": {"top1_agreement": 0.99, "mean_abs_logprob": 0.01, "max_abs_logprob": 0.1, "mean_topk_kl": 0.001},
    "16-bit": {"top1_agreement": 0.95, "mean_abs_logprob": 0.05, "max_abs_logprob": 0.5, "mean_topk_kl": 0.02},
    "8-bit": {"top1_agreement": 0.85, "mean_abs_logprob": 0.2, "max_abs_logprob": 3.0, "mean_topk_kl": 0.1},
    "4-bit": {"top1_agreement": 0.7, "mean_abs_logprob": 0.5, "max_abs_logprob": 5.0, "mean_topk_kl": 0.3},
}
# |Δ| a weight may differ by and still be the reference's (bfloat16 holds 8 bits of mantissa).
WEIGHT_TOLERANCE = 2.0 ** -7


def precision_class(dtype: str | None, bits: int | None = None) -> str:
    """The thresholds' key for a served dtype (``auto`` reads as the checkpoint's 16-bit) and a variant's bits."""
    if bits is not None and bits <= 4:
        return "4-bit"
    if bits is not None and bits <= 8:
        return "8-bit"
    return "float32" if dtype in ("float32", "float") else "16-bit"


class Reference:
    """transformers in float32 on the release's checkpoint: its tokenizer's ids for every prompt, its greedy
    continuation and the logprobs at each continued position, computed once for all engine starts."""

    def __init__(self, checkpoint: Path, tokens: int = TOKENS, prompts=PROMPTS):
        import torch
        from transformers import AutoTokenizer

        from ..models.loading import load_checkpoint

        self.checkpoint, self.tokens = Path(checkpoint), tokens
        self.tokenizer = AutoTokenizer.from_pretrained(self.checkpoint, local_files_only=True)
        model = load_checkpoint(str(self.checkpoint), dtype=torch.float32)
        self.prompts = []
        with torch.inference_mode():
            for prompt in prompts:
                ids = self.ids(prompt)
                continuation, positions = _greedy_with_logprobs(model, ids, tokens)
                self.prompts.append({**prompt, "ids": ids, "continuation": continuation, "positions": positions})
        del model

    def ids(self, prompt: dict) -> list[int]:
        if "messages" in prompt:
            encoded = self.tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True,
                                                         tokenize=True)
            # transformers 5 answers a BatchEncoding, 4 a list.
            return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        return list(self.tokenizer(prompt["text"])["input_ids"])

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def describe(self) -> dict:
        return {"implementation": "transformers", "dtype": "float32", "checkpoint": str(self.checkpoint),
                "tokens": self.tokens, "top_k": TOP_K,
                "prompts": [{"name": prompt["name"], "prompt_tokens": len(prompt["ids"]),
                             "answer": self.text(prompt["continuation"])} for prompt in self.prompts]}


def _greedy_with_logprobs(model, ids: list[int], tokens: int) -> tuple[list[int], list[dict]]:
    """Greedy tokens (the model's KV cache, EOS not special: as the engine's ``ignore_eos``), then one forward pass
    over prompt and continuation for the exact log-softmax at each continued position: its token's logprob and
    the top ``TOP_K``."""
    import torch

    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    continuation = []
    for _ in range(tokens):
        token = int(out.logits[0, -1].argmax())
        continuation.append(token)
        out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    logits = model(input_ids=torch.tensor([ids + continuation])).logits[0].float()
    logp = torch.log_softmax(logits[len(ids) - 1:len(ids) - 1 + tokens], dim=-1)
    positions = []
    for index, token in enumerate(continuation):
        top = torch.topk(logp[index], TOP_K)
        positions.append({"token": token, "logprob": float(logp[index, token]),
                          "top": [(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True)]})
    return continuation, positions


# ---- the engine's side: plain HTTP to its OpenAI-compatible API (vLLM's /tokenize and prompt_logprobs).

async def _post(session, endpoint: Endpoint, path: str, payload: dict) -> dict:
    url = endpoint.base_url.rstrip("/") + path
    async with session.post(url, json={"model": endpoint.model, **payload}, headers=endpoint.headers(),
                            allow_redirects=False) as response:
        if response.status != 200:
            raise RuntimeError(f"{path}: {await http_error(response)}")
        return await response.json(content_type=None)


async def _engine_side(endpoint: Endpoint, reference: Reference, timeout_s: float) -> dict:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                     connector=_connector(endpoint)) as session:
        async def tokenized(prompt):
            if "messages" in prompt:
                body = {"messages": prompt["messages"], "add_generation_prompt": True}
            else:
                body = {"prompt": prompt["text"]}
            return (await _post(session, endpoint, "/tokenize", body))["tokens"]

        async def answered(prompt):
            greedy = await _post(session, endpoint, "/v1/completions", {
                "prompt": prompt["ids"], "max_tokens": reference.tokens, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True})
            forced = await _post(session, endpoint, "/v1/completions", {
                "prompt": prompt["ids"] + prompt["continuation"], "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": TOP_K})
            return {"token_ids": greedy["choices"][0].get("token_ids") or [],
                    "prompt_logprobs": forced["choices"][0].get("prompt_logprobs") or []}

        tokens = [await tokenized(prompt) for prompt in reference.prompts]
        single = [await answered(prompt) for prompt in reference.prompts]
        batched = await asyncio.gather(*(answered(prompt) for prompt in reference.prompts))
    return {"tokens": tokens, "single": single, "batched": list(batched)}


# ---- the comparison.

def parity(reference: Reference, engine_tokens: list[list[int]]) -> dict:
    """The engine's tokenization of each prompt against the reference's, with the first difference shown."""
    mismatches = []
    for prompt, theirs in zip(reference.prompts, engine_tokens, strict=True):
        ours = prompt["ids"]
        if ours == theirs:
            continue
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours),
                                                                                                  len(theirs)))
        mismatches.append({"prompt": prompt["name"], "position": at, "reference_tokens": len(ours),
                           "engine_tokens": len(theirs),
                           "reference_text": reference.text(ours[max(0, at - 4):at + 6]),
                           "engine_text": reference.text(theirs[max(0, at - 4):at + 6])})
    return {"equal": not mismatches, "prompts": len(reference.prompts), "mismatches": mismatches}


def _engine_logprob(entry: dict | None, token: int, floor: float) -> tuple[float, int | None]:
    """The engine's logprob of ``token`` at one prompt position (vLLM lists the position's own token and its top
    k, keyed by id as text) and that token's rank; a token outside the list gets ``floor``."""
    found = (entry or {}).get(str(token))
    if found is None:
        return floor, None
    return float(found["logprob"]), found.get("rank")


def answers(reference: Reference, served: list[dict]) -> dict:
    """Greedy divergence and the teacher-forced figures of one pass (single or batched) over the prompts."""
    agreeing = compared = 0
    deltas, kls, per_prompt = [], [], []
    for prompt, engine in zip(reference.prompts, served, strict=True):
        ours, theirs = prompt["continuation"], engine["token_ids"]
        diverges = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        if diverges is None and len(theirs) < len(ours):
            diverges = len(theirs)
        start = len(prompt["ids"])
        for index, position in enumerate(prompt["positions"]):
            entry = engine["prompt_logprobs"][start + index] if start + index < len(engine["prompt_logprobs"]) \
                else None
            listed = [float(item["logprob"]) for item in (entry or {}).values()]
            floor = min(listed) if listed else -30.0
            logprob, rank = _engine_logprob(entry, position["token"], floor)
            compared += 1
            agreeing += rank == 1
            deltas.append(abs(logprob - position["logprob"]))
            kls.append(max(0.0, sum(math.exp(lp) * (lp - _engine_logprob(entry, token, floor)[0])
                                    for token, lp in position["top"])))
        row = {"prompt": prompt["name"], "first_divergence": diverges}
        if diverges is not None:
            gap = _near_tie(prompt["positions"][diverges], theirs[diverges] if diverges < len(theirs) else None)
            row.update(reference_answer=reference.text(ours), engine_answer=reference.text(theirs),
                       reference_margin=gap)
        per_prompt.append(row)
    return {"tokens_compared": compared, "top1_agreement": agreeing / compared if compared else None,
            "mean_abs_logprob": sum(deltas) / len(deltas) if deltas else None,
            "max_abs_logprob": max(deltas, default=None),
            "mean_topk_kl": sum(kls) / len(kls) if kls else None, "max_topk_kl": max(kls, default=None),
            "prompts_diverging": sum(row["first_divergence"] is not None for row in per_prompt),
            "per_prompt": per_prompt}


def _near_tie(position: dict, engine_token: int | None) -> float | None:
    """How far below the reference's own choice the reference put the engine's choice (logprob): near 0 is a
    near-tie that rounding may flip, large is a real disagreement; None when outside the reference's top k."""
    for token, logprob in position["top"]:
        if token == engine_token:
            return position["logprob"] - logprob
    return None


def judge(figures: dict, limits: dict) -> list[str]:
    """The limits a pass broke, as sentences."""
    broken = []
    if figures["top1_agreement"] is not None and figures["top1_agreement"] < limits["top1_agreement"]:
        broken.append(f"top-1 agreement {figures['top1_agreement']:.3f} < {limits['top1_agreement']}")
    for key, label in (("mean_abs_logprob", "mean |Δ logprob|"), ("max_abs_logprob", "max |Δ logprob|"),
                       ("mean_topk_kl", f"mean top-{TOP_K} KL")):
        if figures[key] is not None and figures[key] > limits[key]:
            broken.append(f"{label} {figures[key]:.4g} > {limits[key]}")
    return broken


def weights_versus_reference(served: Path, reference: Path, limit: int = 5) -> dict | None:
    """Tensors of the same name, shape and floating dtype in both folders that differ beyond bfloat16 rounding
    (relative to the reference tensor's scale); None when the folders are the same."""
    if Path(served).resolve() == Path(reference).resolve():
        return None
    import torch
    from safetensors import safe_open

    def index(folder: Path) -> dict[str, Path]:
        found = {}
        for file in sorted(Path(folder).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                found.update({name: file for name in handle.keys()})  # noqa: SIM118 (safe_open is no dict)
        return found

    ours, theirs = index(reference), index(served)
    compared, differing = 0, []
    for name in sorted(ours.keys() & theirs.keys()):
        with safe_open(str(ours[name]), framework="pt") as a, safe_open(str(theirs[name]), framework="pt") as b:
            x, y = a.get_tensor(name), b.get_tensor(name)
        if x.shape != y.shape or not (x.is_floating_point() and y.is_floating_point()):
            continue
        compared += 1
        x, y = x.to(torch.float32), y.to(torch.float32)
        scale = float(x.abs().max()) or 1.0
        worst = float((x - y).abs().max())
        if worst > WEIGHT_TOLERANCE * scale:
            differing.append({"name": name, "max_abs_difference": worst, "reference_max_abs": scale})
    differing.sort(key=lambda row: -row["max_abs_difference"] / row["reference_max_abs"])
    return {"compared": compared, "differing": differing[:limit], "differing_count": len(differing)}


def check_engine(endpoint: Endpoint, reference: Reference, *, dtype: str | None, bits: int | None = None,
                 weights: dict | None = None, timeout_s: float = 300.0) -> dict:
    """One engine start checked against the reference: parity, both passes' figures, the limits of its precision
    class, and ``verdict`` pass or fail with ``reasons`` (and the first diverging prompt side by side)."""
    try:
        engine = asyncio.run(_engine_side(endpoint, reference, timeout_s))
    except (RuntimeError, OSError, TimeoutError, KeyError, ValueError) as error:
        return {"verdict": "fail", "reasons": [f"the engine's answers could not be read: {error}"[:500]]}
    klass = precision_class(dtype, bits)
    limits = THRESHOLDS[klass]
    report = {"precision_class": klass, "thresholds": limits, "parity": parity(reference, engine["tokens"]),
              "single": answers(reference, engine["single"]), "batched": answers(reference, engine["batched"])}
    reasons = []
    if not report["parity"]["equal"]:
        first = report["parity"]["mismatches"][0]
        reasons.append(f"chat template parity: the engine's tokens for prompt {first['prompt']!r} differ from the "
                       f"reference's at token {first['position']} (engine {first['engine_text']!r}, reference "
                       f"{first['reference_text']!r})")
    for mode in ("single", "batched"):
        reasons += [f"answers ({mode}): {broken}" for broken in judge(report[mode], limits)]
    if weights and weights.get("differing"):
        names = ", ".join(row["name"] for row in weights["differing"])
        reasons.append(f"weights: {weights['differing_count']} tensor(s) differ from the reference checkpoint's "
                       f"({names})")
    report["weights_versus_reference"] = weights
    report["verdict"] = "fail" if reasons else "pass"
    report["reasons"] = reasons
    diverging = next((row for row in report["single"]["per_prompt"] if row["first_divergence"] is not None), None)
    if diverging is not None:
        report["first_diverging_prompt"] = diverging
    return report
