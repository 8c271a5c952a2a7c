"""The HTTP edge: parse and validate a body, call a service or the router, shape JSON or SSE, map errors. No state
changes here beyond what a service function does."""
