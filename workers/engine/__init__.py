"""d0's engine: plain data in, plain data out. Imports nothing from Django, so it runs on a bare GPU node."""

from .transformers_index import install as _index_transformers_once

# Before anything of the engine imports transformers (see transformers_index.py: ~0.4 s of every model read).
_index_transformers_once()
