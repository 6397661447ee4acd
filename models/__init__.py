"""Network definitions (pure torch / MONAI; no Flower)."""
