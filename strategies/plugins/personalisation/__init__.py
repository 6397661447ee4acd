"""Personalisation (run config ``personalisation``): how each site's own model departs from the global one.

Here, the server's side: the run-config section (:mod:`.options`), the methods
(one file each in ``methods/``, registered in :data:`.method.PERSONALISATION`,
each a :class:`.method.PersonalisationMethod`), the rules that refuse
combinations that make no sense (:mod:`.rules`) and the gains (:mod:`.gain`).
The site side of each method is in :mod:`clients.training.personalisation`.
"""
