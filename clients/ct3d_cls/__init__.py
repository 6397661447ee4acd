"""3D CT classification at a site: task, manifest, data, synthetic hospitals, shared sets."""
