"""Control variates (``strategy.control-variates``): drift correction of the sites' local steps.

``none.py`` "none" (plain local steps, the default); ``scaffold.py`` "scaffold"
(SCAFFOLD, Karimireddy et al., ICML 2020, Algorithm 1 with option II): the server's
control variate ``c`` goes down with the model, each site corrects its steps with
``c - c_i`` and sends ``Delta c_i`` back with its update. The rounds' side is the round
feature of ``control_variate_round.py``, the site's :mod:`clients.site.site_scaffold`.
"""
