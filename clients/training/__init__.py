"""Local training at a site: the SiteTask base, the trainer, device selection, sampling."""
