"""The real deployment: a serving engine (vLLM first, SGLang with the same interface) started on the node as an
external program, benchmarked with d0's own load client, checked for correctness, tuned over engine settings
(``serve_sweep``), with the best configuration kept as a recipe. Plain Python: no Django, and no engine imported.
"""

from .serve_sweep import PARAMETERS, serve_sweep

__all__ = ["PARAMETERS", "serve_sweep"]
