"""The site's PACS as its data source: cohort files, DICOMweb and DIMSE transports, the sync."""
