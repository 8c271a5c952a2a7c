"""The engine's contract with the control plane: the worker protocol's messages, the parameters they carry, the
reasons a request is refused, what a checkpoint path is, and how both ends schedule the protocol's I/O threads.
Torch-free and Django-free, so both sides import it."""
