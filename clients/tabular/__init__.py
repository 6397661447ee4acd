"""The tabular classification task (``tabular-cls``): one table row per patient, an MLP."""
