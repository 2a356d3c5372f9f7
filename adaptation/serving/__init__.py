"""Engine reports: the ``serve_sweep`` stage's results (vLLM serving the model on a node), led by the recipe."""
