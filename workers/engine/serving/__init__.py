"""The real deployment: a serving engine (vLLM first, SGLang with the same interface) started on the node as an
external program, benchmarked with d0's own load client, checked for correctness, tuned over engine settings
(``serve_sweep``), with the best configuration kept as a recipe; and the same client against an endpoint someone
else runs (``endpoint_bench``). Plain Python: no Django, and no engine imported.
"""

from .stage import ENDPOINT_PARAMETERS, PARAMETERS, endpoint_bench, serve_sweep

__all__ = ["ENDPOINT_PARAMETERS", "PARAMETERS", "endpoint_bench", "serve_sweep"]
