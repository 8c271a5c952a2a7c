"""What runs inside `manage.py serve`: the engine client, the worker supervisor, the routing of names to served
models, the mirror of serving state in the database, and the host probe. Never imports torch."""
