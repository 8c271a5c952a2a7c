"""Checkpoints, lineage, and the trainer attachment / step barrier routes (`/api/weights/*`)."""
