"""The write paths: one function per action (load, unload, catalogue), called alike by the API, `manage.py` and the
operator UI."""
