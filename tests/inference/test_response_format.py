"""response_format over HTTP on the random-weight demo model, whose free output is noise: only the grammar can make
it valid JSON. json_schema output parses and validates with `jsonschema` for 50 seeds across schemas (nested
objects, arrays, enums, required keys, bounded numbers, string patterns), side by side with unconstrained requests
in the same batch; json_object gives an object; the statuses of the spec's table; a schema that is not JSON Schema
is 400 before anything runs; the closing stream chunk carries the status; the openai package's parse path works."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

from tests.inference.serving import sse_events
from tests.inference.session_turns import error_of, load

pytestmark = pytest.mark.django_db(transaction=True)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "point": {
            "type": "object",
            "properties": {
                "x": {"type": "number", "minimum": -1, "maximum": 1},
                "y": {"type": "integer", "minimum": -5, "maximum": 5},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "ok": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 6},
    },
    "required": ["point", "ok"],
    "additionalProperties": False,
}
ITEMS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}, "kind": {"const": "item"}},
        "required": ["id", "kind"],
        "additionalProperties": False,
    },
    "minItems": 1,
    "maxItems": 4,
}
SCHEMAS = [PERSON, NESTED, ITEMS]
MESSAGES = [{"role": "user", "content": "Describe it as JSON."}]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    from inference.engine.demo_model import write_demo_model  # torch: only the test process imports it

    return write_demo_model(tmp_path_factory.mktemp("demo"))


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def ask(api: httpx.Client, **body) -> httpx.Response:
    return api.post("/v1/chat/completions", json={"model": "demo", "messages": MESSAGES, "max_tokens": 200, **body})


def test_json_schema_output_validates_for_50_seeds_beside_free_requests(api, demo_dir):
    load(api, demo_dir, "demo", max_concurrent=8)

    def constrained(seed: int) -> tuple[dict, dict]:
        schema = SCHEMAS[seed % len(SCHEMAS)]
        response = ask(api, response_format=json_schema(schema), seed=seed, temperature=1.0)
        assert response.status_code == 200, response.text
        return schema, response.json()

    def free(seed: int) -> dict:
        response = ask(api, seed=seed, temperature=1.0, max_tokens=40)
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(8) as pool:
        free_runs = [pool.submit(free, seed) for seed in range(12)]
        runs = list(pool.map(constrained, range(50)))
    for schema, body in runs:
        choice = body["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        assert body["response_format_status"] == "applied"
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    free_bodies = [f.result() for f in free_runs]
    assert all("response_format_status" not in b for b in free_bodies)
    # the free requests were not constrained: noise, not JSON
    assert sum(_is_json(b["choices"][0]["message"]["content"]) for b in free_bodies) < len(free_bodies)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_numbers_end_on_a_model_that_loves_digits(api, demo_dir):
    """A random-weight model pushed to digits (logit_bias on every digit token) writes each number only as far as the
    grammar lets it (16 integral digits, fewer where the maximum says so), so the JSON completes within max_tokens."""
    from inference.engine.text.tokenizer import Tokenizer
    from tests.engine.digit_model import digit_bias

    load(api, demo_dir, "demo")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "p": {"type": "number", "maximum": 100}},
        "required": ["n", "x", "p"],
        "additionalProperties": False,
    }
    bias = digit_bias(Tokenizer.from_hf_dir(demo_dir))
    body = ask(api, response_format=json_schema(schema), seed=2, temperature=1.0, max_tokens=300, logit_bias=bias)
    choice = body.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and body.json()["response_format_status"] == "applied", choice
    value = json.loads(choice["message"]["content"])
    jsonschema.validate(value, schema)
    assert len(str(value["n"])) == 16 and value["p"] < 100


def test_json_object_gives_an_object(api, demo_dir):
    load(api, demo_dir, "demo")
    for seed in range(5):
        body = ask(api, response_format={"type": "json_object"}, seed=seed, temperature=1.0, max_tokens=400).json()
        if body["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)
            assert body["response_format_status"] == "applied"
        else:  # an unbounded object may run out of tokens; then it says so
            assert body["response_format_status"] == "not_enforced"


def test_the_status_rows(api, demo_dir):
    load(api, demo_dir, "demo")
    assert ask(api, response_format={"type": "text"}).json()["response_format_status"] == "applied"
    assert ask(api, response_format={"type": "yaml"}).json()["response_format_status"] == "ignored_unknown_type"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with_tools = ask(api, response_format=json_schema(PERSON), tools=tools).json()
    assert with_tools["response_format_status"] == "ignored_tools_present"
    cut = ask(api, response_format=json_schema(PERSON), max_tokens=3).json()
    assert (cut["choices"][0]["finish_reason"], cut["response_format_status"]) == ("length", "not_enforced")
    unique = {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "minItems": 1, "maxItems": 3}
    downgraded = ask(api, response_format=json_schema(unique), seed=1, temperature=1.0).json()
    assert downgraded["response_format_status"] == "schema_downgraded"
    value = json.loads(downgraded["choices"][0]["message"]["content"])  # the rest of the schema still holds
    assert isinstance(value, list) and 1 <= len(value) <= 3 and set(value) <= {1, 2, 3}
    assert "response_format_status" not in ask(api).json()


@pytest.mark.parametrize(
    "response_format",
    [
        json_schema({"type": "nonsense"}),
        json_schema({"type": "object", "properties": 5}),
        json_schema({"type": "string", "minLength": -1}),
        json_schema({"type": "object", "required": ["a", "a"]}),  # the metaschema's rule, not the grammar's
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "not an object"}},
        "json_object",
    ],
)
def test_a_schema_that_is_not_json_schema_is_400(api, demo_dir, response_format):
    load(api, demo_dir, "demo")
    assert error_of(ask(api, response_format=response_format)) == (400, "invalid_request_error")


def test_the_closing_stream_chunk_carries_the_status_and_the_stream_is_the_same_json(api, demo_dir):
    load(api, demo_dir, "demo")
    body = {"response_format": json_schema(PERSON), "seed": 7, "temperature": 1.0}
    whole = ask(api, **body).json()
    with api.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "demo", "messages": MESSAGES, "max_tokens": 200, "stream": True, **body},
    ) as response:
        events = sse_events(response)
    chunks = [e for e in events if isinstance(e, dict)]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["response_format_status"] == "applied"
    assert all("response_format_status" not in c for c in chunks[:-1])


def test_the_openai_package_gets_schema_valid_json(server, api, demo_dir):
    load(api, demo_dir, "demo")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    reply = client.chat.completions.create(
        model="demo", messages=MESSAGES, response_format=json_schema(NESTED), seed=3, temperature=1.0, max_tokens=200
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), NESTED)
