"""The one CSV manifest format and the one skip-and-count loop of the site loaders."""
