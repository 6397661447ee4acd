"""A vertical federation's coordinator: its messages, the PSI, pvFed and split learning (docs/VERTICAL.md)."""
