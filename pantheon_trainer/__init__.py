"""The trainer's library: attach to the weights a Pantheon server serves and write them in place (client.py).

A training process installs it with `pip install pantheon[trainer]` (httpx, beside the torch engine it maps the
served storages with); the server never imports it.
"""
