"""Server optimizers (``strategy.server-opt``): the aggregator's ``Delta`` -> the model's step.

``base.py`` the shared ``server-opt.*`` section and base class; ``sgd.py`` "sgd" (``x <- x -
eta Delta``, the default: ``x - Delta``); ``avgm.py`` "avgm" (FedAvgM, Hsu et al. 2019);
``adaptive.py`` the first and second moments of Reddi et al. 2021, Algorithm 2, shared by
``adagrad.py`` "adagrad", ``adam.py`` "adam" and ``yogi.py`` "yogi".
"""
