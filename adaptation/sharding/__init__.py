"""Sharded validation runs: the run page and the comparison of a model's runs, and the layout the whole adaptation
validates."""
