"""Site-side code: data readers, synthetic data, tasks and trainers (no Flower imports)."""
