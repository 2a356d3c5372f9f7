"""The quality of what a serve sweep serves, on real weights: each engine start's numerics (the variant served, its
dtype, quantization and KV-cache type) checked once, while its engine is up, against the release.

- *correctness* (``reference_check``): chat-template parity and the answers against transformers in float32;
- *accuracy* (``accuracy``): lm-evaluation-harness against the served endpoint, and the same task on the reference
  (or a published score), judged by the gate "served Wilson lower bound >= reference - X points";
- *perplexity* on a local text, for a quantized variant's Δ against the checkpoint as shipped;
- *recovery* of a quantized variant: its accuracy as a share of the unquantized trial's, against its threshold.

A numerics that fails any of these is marked (``failed-correctness``, ``failed-accuracy``, ``under-recovery``) and
its trials are never the pick, however fast (``mark``). On random weights none of this means anything: the sweep
says so and keeps its float32 check of the pick's greedy tokens (``correctness``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .client import Endpoint
from .reference_check import Reference, check_engine, weights_versus_reference
from .variants import AS_SHIPPED

NUMERICS = ("variant", "dtype", "quantization", "kv_cache_dtype")
# A failed check's trial status, by the check.
FAILED = {"correctness": "failed-correctness", "accuracy": "failed-accuracy", "recovery": "under-recovery"}


def numerics_of(settings: dict) -> dict:
    return {key: settings[key] for key in NUMERICS if settings.get(key) is not None}


def numerics_key(settings: dict) -> str:
    return json.dumps(numerics_of(settings), sort_keys=True)


def numerics_label(numerics: dict) -> str:
    variant = numerics.get("variant", AS_SHIPPED).replace("_", " ")
    rest = [f"{key} {value}" for key, value in numerics.items() if key != "variant"]
    return ", ".join([variant, *rest])


class ReferenceUnavailable(RuntimeError):
    """The reference could not be computed on this node (the stage fails with why: nothing can be validated)."""


class QualityCheck:
    """One sweep's checks: the reference (computed at the first engine start), an entry per numerics served."""

    def __init__(self, reference_checkpoint: Path, *, tokens: int, variants: dict[str, dict],
                 accuracy: dict | None, progress):
        self.reference_checkpoint, self.tokens = Path(reference_checkpoint), tokens
        self.variants, self.accuracy, self.progress = variants, accuracy, progress
        self.reference: Reference | None = None
        self.entries: dict[str, dict] = {}
        self._weights: dict[str, dict | None] = {}

    def check(self, endpoint: Endpoint, settings: dict, served_checkpoint: Path) -> dict:
        """The entry of this start's numerics, made now while its engine is up unless an earlier start made it."""
        key = numerics_key(settings)
        if key in self.entries:
            return self.entries[key]
        numerics = numerics_of(settings)
        variant = self.variants.get(numerics.get("variant", AS_SHIPPED)) or {}
        if self.reference is None:
            self.progress("computing the reference: transformers in float32 on the release's checkpoint")
            started = time.perf_counter()
            try:
                self.reference = Reference(self.reference_checkpoint, self.tokens)
            except Exception as error:  # transformers raises what the checkpoint's files make it raise
                raise ReferenceUnavailable(f"the float32 reference could not be computed from "
                                           f"{self.reference_checkpoint}: {type(error).__name__}: {error}"[:800]) \
                    from None
            self.reference_seconds = time.perf_counter() - started
        folder = str(served_checkpoint)
        if folder not in self._weights:
            self._weights[folder] = weights_versus_reference(served_checkpoint, self.reference_checkpoint)
        self.progress(f"checking {numerics_label(numerics)} against the reference")
        started = time.perf_counter()
        entry = {"numerics": numerics, "label": numerics_label(numerics), "variant": variant or None,
                 "correctness": check_engine(endpoint, self.reference, dtype=settings.get("dtype"),
                                             bits=variant.get("bits"), weights=self._weights[folder])}
        # What validating this numerics cost, beside the serving it checks (benchmarks/validation_cost.py).
        entry["seconds"] = {"correctness": time.perf_counter() - started}
        if self.accuracy:
            from .accuracy import evaluate_endpoint

            self.progress(f"evaluating {numerics_label(numerics)} on {self.accuracy['task']} (lm-eval)")
            started = time.perf_counter()
            entry["accuracy"] = _guarded(lambda: evaluate_endpoint(
                endpoint.base_url, endpoint.model, self.reference_checkpoint, Path(self.accuracy["task_dir"]),
                self.accuracy["task"]))
            if self.accuracy.get("perplexity_task"):
                entry["perplexity"] = _guarded(lambda: evaluate_endpoint(
                    endpoint.base_url, endpoint.model, self.reference_checkpoint, Path(self.accuracy["task_dir"]),
                    self.accuracy["perplexity_task"]))
            if self.accuracy.get("chat_task"):
                # Through the chat API (the engine applies the template): reported, not gated, since the
                # reference's side would be CPU generation (about a minute for 27 answers on 2 cores).
                entry["chat_accuracy"] = _guarded(lambda: evaluate_endpoint(
                    endpoint.base_url, endpoint.model, self.reference_checkpoint, Path(self.accuracy["task_dir"]),
                    self.accuracy["chat_task"], api="chat-completions"))
            entry["seconds"]["accuracy"] = time.perf_counter() - started
        self.entries[key] = entry
        return entry

    def finish(self) -> dict:
        """The gate and the recoveries, once every start is served (the reference's evaluation runs now, with no
        engine beside it); each entry's ``verdict`` and ``reasons``."""
        reference_accuracy = None
        if self.accuracy:
            started = time.perf_counter()
            reference_accuracy = self._reference_accuracy()
            self.reference_accuracy_seconds = time.perf_counter() - started
        shipped = self._unquantized()
        for entry in self.entries.values():
            reasons: list[tuple[str, str]] = [("correctness", reason)
                                              for reason in entry["correctness"].get("reasons", [])]
            if self.accuracy:
                served = entry.get("accuracy") or {}
                if served.get("error"):
                    reasons.append(("accuracy", f"the accuracy evaluation failed: {served['error']}"))
                elif reference_accuracy and not reference_accuracy.get("error"):
                    from .accuracy import gate

                    held_to = (reference_accuracy["accuracy"] if reference_accuracy["source"] == "published"
                               else reference_accuracy)
                    entry["gate"] = gate(served, held_to, self.accuracy["max_drop_points"])
                    if not entry["gate"]["passed"]:
                        reasons.append(("accuracy", entry["gate"]["rule"]))
            if entry["numerics"].get("variant", AS_SHIPPED) != AS_SHIPPED:
                entry["recovery"] = recovery(entry, shipped)
                if entry["recovery"].get("passed") is False:
                    reasons.append(("recovery", entry["recovery"]["rule"]))
            entry["verdict"] = FAILED[reasons[0][0]] if reasons else "pass"
            entry["reasons"] = [reason for _, reason in reasons]
        return {"reference": {**(self.reference.describe() if self.reference else {}),
                              "seconds": getattr(self, "reference_seconds", None),
                              "accuracy_seconds": getattr(self, "reference_accuracy_seconds", None),
                              "accuracy": reference_accuracy},
                "accuracy": self.accuracy, "entries": list(self.entries.values())}

    def _reference_accuracy(self) -> dict:
        if self.accuracy.get("published"):
            return {**self.accuracy["published"], "source": "published"}
        return {**self._measured_reference(), "source": "measured"}

    def _measured_reference(self) -> dict:
        """lm-eval on the reference (transformers, float32): the accuracy task, and the perplexity text."""
        from .accuracy import evaluate_reference

        self.progress(f"evaluating the reference on {self.accuracy['task']} (lm-eval, transformers float32)")
        measured = _guarded(lambda: evaluate_reference(self.reference_checkpoint, Path(self.accuracy["task_dir"]),
                                                       self.accuracy["task"]))
        if self.accuracy.get("perplexity_task") and not measured.get("error"):
            measured["perplexity"] = _guarded(lambda: evaluate_reference(
                self.reference_checkpoint, Path(self.accuracy["task_dir"]), self.accuracy["perplexity_task"]))
        return measured

    def _unquantized(self) -> dict | None:
        """The entry quantized variants are held against: the checkpoint as shipped, at its best-checked dtype."""
        shipped = [entry for entry in self.entries.values()
                   if entry["numerics"].get("variant", AS_SHIPPED) == AS_SHIPPED]
        return max(shipped, key=lambda entry: (entry["correctness"].get("verdict") == "pass",
                                               entry["numerics"].get("dtype") in ("float32", "float")), default=None)

    def mark(self, trials: list[dict]) -> int:
        """Trials whose numerics failed a check take that failure as their status (kept with their figures, never
        the pick); returns how many were marked."""
        marked = 0
        for trial in trials:
            entry = self.entries.get(numerics_key(trial.get("settings") or {}))
            if entry is None or trial["status"] != "ok":
                continue
            trial["quality"] = {"verdict": entry["verdict"], "label": entry["label"]}
            if entry["verdict"] != "pass":
                trial["status"], trial["reason"] = entry["verdict"], "; ".join(entry["reasons"])[:1000]
                marked += 1
        return marked


def _guarded(evaluate) -> dict:
    """An evaluation's result, or its failure as ``{"error": ...}``: a harness that breaks fails the check it
    serves, never the whole sweep's other figures."""
    try:
        return evaluate()
    except Exception as error:  # lm-eval raises whatever its task or model raise
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def recovery(entry: dict, shipped: dict | None) -> dict:
    """A quantized variant against the checkpoint as shipped, on the same prompts and tasks: accuracy as a share of
    the unquantized trial's, Δ perplexity, top-1 agreement with the reference; passed when the accuracy share
    reaches the variant's threshold."""
    threshold = (entry.get("variant") or {}).get("threshold")
    own = (entry.get("accuracy") or {}).get("accuracy")
    base = ((shipped or {}).get("accuracy") or {}).get("accuracy")
    out = {"threshold_pct": threshold * 100 if threshold else None, "against": (shipped or {}).get("label"),
           "top1_agreement": entry["correctness"].get("single", {}).get("top1_agreement")}
    ppl, base_ppl = ((entry.get("perplexity") or {}).get("word_perplexity"),
                     ((shipped or {}).get("perplexity") or {}).get("word_perplexity"))
    if ppl is not None and base_ppl is not None:
        out["delta_perplexity"] = ppl - base_ppl
    if own is None or not base:
        return {**out, "passed": None, "rule": "no accuracy figure to compare (the accuracy check did not run)"}
    share = own / base
    passed = threshold is None or share >= threshold
    return {**out, "accuracy_pct": 100 * share, "passed": passed,
            "rule": f"{entry['label']} keeps {100 * share:.1f}% of {out['against']}'s accuracy "
                    f"({own:.3f} against {base:.3f}); its threshold is {100 * threshold:.0f}%"
            if threshold else f"keeps {100 * share:.1f}% of the unquantized accuracy"}


def accuracy_settings(params: dict) -> dict | None:
    """What the accuracy gate evaluates, from the stage's parameters: the shipped task unless the team names its
    own folder, the gate's X, a published reference score in place of the measured one; None when turned off."""
    if not params.get("accuracy_gate"):
        return None
    from .accuracy import ACCURACY_TASK, CHAT_TASK, PERPLEXITY_TASK, SHIPPED_TASKS

    own = params.get("accuracy_task_dir")
    if own and not params.get("accuracy_task"):
        raise ValueError("accuracy_task_dir needs accuracy_task: the task in it to run")
    return {"task_dir": str(own or SHIPPED_TASKS), "task": params.get("accuracy_task") or ACCURACY_TASK,
            "perplexity_task": None if own else PERPLEXITY_TASK, "chat_task": None if own else CHAT_TASK,
            "max_drop_points": params["accuracy_max_drop_points"],
            "published": params.get("accuracy_reference")}


def variant_weights(variant: dict | None) -> dict:
    """The recipe's weights for the chosen variant: its folder, name and how it was made (as shipped: nothing)."""
    if not variant or variant.get("name", AS_SHIPPED) == AS_SHIPPED:
        return {"variant": AS_SHIPPED}
    return {"path": variant["path"], "variant": variant["name"],
            "description": f"{variant['name']}: {variant.get('method')} ({variant.get('bits')}-bit), made on the "
                           f"node by {variant.get('made_by')} from the checkpoint as shipped"}


def variant_summary(trials: list[dict], quality: dict, variants: dict[str, dict]) -> list[dict]:
    """Per numerics served: its best throughput (median of its best configuration's runs), peak memory, disk size,
    accuracy, recovery and verdict: the quality-against-speed view. ``recommended``: passed every check."""
    from statistics import median

    rows = []
    for entry in quality["entries"]:
        served = [trial for trial in trials if trial.get("metrics") and trial["status"] in ("ok", *FAILED.values())
                  and numerics_of(trial.get("settings") or {}) == entry["numerics"]]
        by_config: dict[str, list[dict]] = {}
        for trial in served:
            key = json.dumps({"settings": trial["settings"], "client": trial["client"]}, sort_keys=True)
            by_config.setdefault(key, []).append(trial)
        best = max(by_config.values(), default=[],
                   key=lambda runs: median(run["metrics"]["output_tokens_per_s"] or 0 for run in runs))
        variant = variants.get(entry["numerics"].get("variant", AS_SHIPPED)) or {}
        rows.append({
            "label": entry["label"], "numerics": entry["numerics"], "bits": variant.get("bits"),
            "method": variant.get("method"), "disk_bytes": variant.get("disk_bytes"),
            "output_tokens_per_s": median(run["metrics"]["output_tokens_per_s"] or 0 for run in best) if best
            else None,
            "peak_memory_bytes": max((run["metrics"].get("peak_memory_bytes") or 0 for run in best), default=None)
            or None,
            "accuracy": (entry.get("accuracy") or {}).get("accuracy"),
            "word_perplexity": (entry.get("perplexity") or {}).get("word_perplexity"),
            "top1_agreement": entry["correctness"].get("single", {}).get("top1_agreement"),
            "recovery": entry.get("recovery"), "verdict": entry["verdict"], "reasons": entry["reasons"],
            "recommended": entry["verdict"] == "pass"})
    return rows
