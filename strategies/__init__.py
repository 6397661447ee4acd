"""Server-side federated logic: pure-numpy math plug-ins (aggregation, schedules, selection, codecs)."""
