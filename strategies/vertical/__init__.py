"""Vertical federations, the coordinator's pure parts: options, the PSI plan, pvFed's aggregation."""
