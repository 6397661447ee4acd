"""Flower glue: ServerApp, ClientApp, run/node config parsing, MLflow tracking."""
