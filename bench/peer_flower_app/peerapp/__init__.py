"""peerapp: a plain Flower app (Flower's FedAvg, a quickstart-style ClientApp) on site folders."""
