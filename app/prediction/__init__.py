"""Applying a logged model at a hospital (``make predict``): inputs, per-task prediction, outputs."""
