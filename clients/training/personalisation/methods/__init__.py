"""The site side of the personalisation methods, one per file, each registered in
:data:`clients.training.personalisation.site_personalisation.SITE_PERSONALISATION`
under the name of its server-side rules (:mod:`strategies.plugins.personalisation.methods`)."""
