"""The weights tests run Pantheon as a user does, with the fixtures of tests/inference/conftest.py (a server per
module, its database, an operator's client), shared from there rather than written twice."""

from tests.inference.conftest import api, client_token, operator_token, server, serving_db, start_server

__all__ = ["api", "client_token", "operator_token", "server", "serving_db", "start_server"]
