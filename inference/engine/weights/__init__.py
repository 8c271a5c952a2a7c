"""The weights a trainer attaches to: their shared storage, the handles to it, checkpoint files, the step barrier."""
