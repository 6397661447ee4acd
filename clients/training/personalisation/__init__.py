"""Site side of personalisation: the Reptile meta-step loop and FedBN's local layers (no Flower)."""
