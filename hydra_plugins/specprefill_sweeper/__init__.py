"""Hydra plugin package of specprefill-bench (Hydra finds sweepers under ``hydra_plugins``)."""
