"""Pulmonary-embolism segmentation at a site: task, manifest, data, synthetic hospitals, shared sets."""
