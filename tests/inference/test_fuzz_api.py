"""schemathesis against a running server, bounded for CI (tests/inference/fuzzing.py; bench/fuzz_api.py is the full
run): every route of the OpenAPI document fuzzed with an operator's token while stories260K is served; no answer is
a server error (a 5xx other than a documented 503), every answer matches the document, and the server still serves
afterwards."""

import pytest

from tests.inference.fuzzing import fuzz, still_serving
from tests.inference.serving import operator_client

pytestmark = pytest.mark.django_db(transaction=True)

MAX_EXAMPLES = 10  # per operation and phase: about two thousand requests in all


def test_fuzzing_finds_no_server_error_and_no_answer_off_the_schema(server, operator_token, stories_hf_dir):
    with operator_client(server, operator_token) as api:
        loaded = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"})
        assert loaded.status_code == 200, loaded.text
        run = fuzz(server.url, operator_token, max_examples=MAX_EXAMPLES, seed=37)

        assert run.failures == [], run.output[-8000:]
        assert run.exit_code == 0, run.output[-8000:]
        assert run.operations >= 31  # every route but /session/watch
        assert 1000 <= run.requests <= 5000, run.summary()
        assert not [status for status in run.statuses if status >= 500 and status != 503], run.summary()
        assert run.statuses[200] > 0, run.summary()  # valid requests got through, not only refusals
        assert still_serving(server.url)
