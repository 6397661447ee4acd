"""A vertical federation at the site (no Flower): the stages of the PSI, pvFed and split learning."""
