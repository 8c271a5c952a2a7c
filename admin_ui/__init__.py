"""The operator web UI: views, templates and static files over the same services the API uses."""
