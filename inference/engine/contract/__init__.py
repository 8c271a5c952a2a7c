"""The engine's contract with the control plane: the worker protocol's messages, the parameters they carry, the
reasons a request is refused, and what a checkpoint path is. Torch-free and Django-free, so both sides import it."""
