"""Local-steps schedules (``strategy.schedule``): the tau each selected site runs."""
