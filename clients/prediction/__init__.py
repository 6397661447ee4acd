"""What a task gives ``make predict``: the items of a folder and a predictor of one item (no Flower imports)."""
