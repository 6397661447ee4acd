"""Client selectors (``strategy.selector``): the sites that train each round."""
