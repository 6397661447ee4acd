"""Vertical federations, the coordinator's pure parts: the PSI plan, pvFed's aggregation.

The ``vertical.*`` section both ends parse is :mod:`strategies.wire.vertical_options`.
"""
