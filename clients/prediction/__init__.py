"""What a task gives ``make predict``: a folder's items and a predictor of one item (no Flower)."""
