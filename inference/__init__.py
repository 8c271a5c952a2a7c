"""Pantheon's serving control plane: catalogue, routes, worker supervision. The torch engine lives in `engine/`."""
