"""The control plane's side of the serving stages: ``serve_sweep`` (a real engine on a node that offers it, tuned
over engine settings) and ``endpoint_bench`` (d0's load client against an endpoint the team registered)."""

from __future__ import annotations

from django.urls import reverse

from workers.engine.parameters import ParameterError
from workers.engine.serving.launchers import ranks_of, split_over_nodes
from workers.engine.serving.recipe import checked_engine, checked_recipe, number
from workers.engine.sweep.result import EndpointBenchResult, ServeSweepResult, served

from .ledger import calibration
from ..stages import Outcome, StageHandler, register
from ..models import ServingEndpoint, StageRun
from ..sweeps.services import with_measured_hardware
from .services import (ENDPOINT_REPORT_KIND, ENGINE_REPORT_KIND, deployment_line, endpoint_parameters, engine_of,
                       validation)


def validated_numerics(stored: dict) -> str:
    """On real weights, the numerics the recipe serves and its accuracy against the reference, as the headline
    says them (" serving w8a8-int8, dtype bfloat16 (accuracy 61.0% against the reference's 63.0%, gate passed)");
    nothing on random weights."""
    checked = validation(stored)
    chosen = next((entry for entry in checked.get("entries", ()) if entry["chosen"]), None)
    if chosen is None:
        return ""
    served_accuracy, gate = (chosen["accuracy"] or {}).get("accuracy"), chosen["gate"]
    reference = ((checked["reference"]["accuracy"]) or {}).get("accuracy")
    if served_accuracy is None:
        quality = "answers checked against the reference, no accuracy gate"
    else:
        quality = f"accuracy {100 * served_accuracy:.1f}%" + (
            f" against the reference's {100 * reference:.1f}%" if reference is not None else "")
        if gate is not None:
            quality += ", gate passed" if gate["passed"] else ", gate not passed"
    return f" serving {chosen['label'][:200]} ({quality})"


@register
class ServeSweep(StageHandler):
    kind = ENGINE_REPORT_KIND

    def eligible(self, job, params: dict, nodes: list) -> list:
        engine = params.get("engine", "vllm")
        serving = [node for node in nodes if engine_of(node.host_facts or {}, engine)]
        if not serving:
            raise ValueError(f"no eligible node offers a usable {engine} engine (start a node worker with "
                             f"--engine {engine}=/path/to/its/python)")
        return serving

    def prepare(self, job, params: dict, nodes: list) -> dict:
        """The node's measured figures for the roofline, and the cluster's calibration of this engine's
        predictions (the prediction ledger: none until the cluster has measured trials)."""
        return {**with_measured_hardware(params, nodes[0]),
                "calibration": calibration(job.cluster, params.get("engine", "vllm"))}

    def check(self, job) -> None:
        """A layout vLLM cannot spread over the job's node count is refused at submission (a 400 naming it)."""
        declared = job.parameters.get(self.kind) or {}
        try:
            split_over_nodes(declared.get("settings") or {}, int(declared.get("node_count") or 1))
        except ValueError as error:
            raise ParameterError(f"{self.kind}.node_count", str(error)) from None
        if int(declared.get("node_count") or 1) > 1 and (declared.get("variants") or ["as_shipped"]) != ["as_shipped"]:
            raise ParameterError(f"{self.kind}.variants", "quantized variants are made and served on one node; "
                                 "a deployment over several nodes serves the checkpoint as shipped")

    def world_size(self, params: dict) -> int:
        """The engine's ranks: TP x PP x DP."""
        replica, dp = ranks_of(params.get("settings") or {})
        return replica * dp

    def store(self, run) -> None:
        """What the node said of its engine and recipe is checked as it arrives (``recipe.checked_recipe``): the
        run keeps the checked engine and recipe, the command rebuilt from the checked settings; a recipe that
        cannot be checked fails the job (a ValueError). A follower node of a multi-node deployment reports no
        recipe (node rank 0's run holds it)."""
        if run.result.get("role") == "follower":
            return
        engine = checked_engine(run.result.get("engine"))
        try:
            recipe = checked_recipe(run.result.get("recipe"), engine)
        except ValueError as error:
            raise ValueError(f"the node's recipe was refused: {error}") from None
        run.result = {**run.result, "engine": engine, "recipe": recipe}
        StageRun.objects.filter(pk=run.pk).update(result=run.result)

    def outcome(self, stored: dict) -> Outcome:
        if stored.get("role") == "follower":
            return Outcome(f"node rank {stored.get('node_rank', '?')} of the deployment: ran "
                           f"{stored.get('engine_starts', 0)} engine start(s) headless for node rank 0")
        result = ServeSweepResult.from_dict(stored)
        measured = (result.recipe or {}).get("measured") or {}
        warnings = []
        if result.weights.get("kind") == "validation checkpoint":
            warnings += ["served a validation checkpoint (reduced, random weights), not the release's weights",
                         "no accuracy check: random weights"]
        verdict = (result.correctness or {}).get("verdict")
        # "agree" is the random-weights check's word for a pass, "pass" the real-weights check's.
        if verdict not in (None, "agree", "pass"):
            warnings.append(f"correctness: {verdict}")
        if result.verdict and not result.verdict.confirmed:
            warnings.append(f"the pick is {result.verdict.verdict}: {result.verdict.reason}")
        plan = stored.get("plan") if isinstance(stored.get("plan"), dict) else {}
        if plan.get("why"):
            warnings.append(f"layout: {plan['why']}"[:500])
        goodput = (result.recipe or {}).get("goodput")
        goodput = goodput if isinstance(goodput, dict) else {}
        figure = f"{number(measured.get('output_tokens_per_s')) or 0:.1f} output tok/s"
        if number(goodput.get("goodput_per_device")) is not None:
            figure = (f"goodput {number(goodput.get('goodput_requests_per_s')) or 0:.2f} req/s under the SLOs, "
                      f"{number(goodput.get('goodput_per_device')):.2f} per device; {figure}")
        return Outcome(f"recipe on {result.engine.get('name', '?')} {result.engine.get('version') or ''} at "
                       f"{deployment_line(stored.get('deployment'), (result.recipe or {}).get('settings'))}"
                       f"{validated_numerics(stored)}: {figure}; {served(result.trials)}", warnings)

    def page(self, job, run) -> str | None:
        if run.status != "succeeded" or (run.result or {}).get("role") == "follower":
            return None
        return reverse("engine-report", args=[run.pk])


@register
class EndpointBench(StageHandler):
    kind = ENDPOINT_REPORT_KIND

    def check(self, job) -> None:
        if not job.team_id:
            return
        endpoint = (job.parameters.get(self.kind) or {}).get("endpoint")
        if endpoint is None:
            raise ParameterError(f"{self.kind}.endpoint", "required: the id of one of the team's serving endpoints "
                                                          "(/endpoints/)")
        if not ServingEndpoint.objects.filter(team_id=job.team_id, pk=endpoint).exists():
            raise ParameterError(f"{self.kind}.endpoint", f"no serving endpoint {endpoint} in this team")

    def prepare(self, job, params: dict, nodes: list) -> dict:
        # The stored endpoint's address and (decrypted) key go only into the dispatched message, never the job row.
        return {**params, **endpoint_parameters(job.team, params.get("endpoint"))}

    def outcome(self, stored: dict) -> Outcome:
        result = EndpointBenchResult.from_dict(stored)
        best = result.best
        throughput = best.metrics.output_tokens_per_s if best and best.metrics else None
        return Outcome(f"{result.endpoint.get('served_model', '?')} at {result.endpoint.get('base_url', '?')}: best "
                       f"{throughput or 0:.1f} output tok/s at concurrency "
                       f"{best.client.get('concurrency', '?') if best else '?'}")

    def page(self, job, run) -> str | None:
        return reverse("endpoint-report", args=[run.pk]) if run.status == "succeeded" else None
