"""Personalisation (run config ``personalisation``): how each site's own model departs from the global one.

The run-config section (:mod:`.options`) and the rules that refuse combinations
that make no sense (:mod:`.rules`) live here; the site-side algorithms are in
:mod:`clients.training.personalisation`.
"""
