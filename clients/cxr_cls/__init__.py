"""Chest X-ray classification at a site: task, manifest, data, synthetic hospitals, shared sets."""
