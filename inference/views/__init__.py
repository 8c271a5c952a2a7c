"""The routes of the serving control plane: health (GET /), the OpenAI-compatible /v1 routes, the operator /admin
routes. Each module's views are thin: they validate, call the dispatcher or a do_* function, and shape the body."""
