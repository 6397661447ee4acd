"""Aggregators (``strategy.aggregator``): replies -> the update applied to the global model."""
