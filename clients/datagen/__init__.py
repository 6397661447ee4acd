"""Writers of federations of site folders: synthetic hospitals and the shared real sets."""
