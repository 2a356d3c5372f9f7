"""Operator coverage: each op_coverage stage's reports per backend × dtype, the team's operator library, virtual
backends described by operator lists, the heatmap, a model's gaps and the diff of two models."""
