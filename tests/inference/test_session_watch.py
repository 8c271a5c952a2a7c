"""GET /session/watch against a running server with a short idle TTL and grace period: an unwatched session is
released once idle for the TTL; a watched one outlives it, and is released a grace period after its watch closes
(daphne notices the client going away, and the server closes the watch), unless a new watch arrives first. The
stream is comments only: `: watch established`, then keep-alives."""

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.inference.serving import PantheonServer, operator_client, wait_for
from tests.inference.session_turns import USER_TURNS, converse, load, sessions_of

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_TTL_S = 2.0
GRACE_S = 1.0
KEEPALIVE_S = 0.2


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(
        PANTHEON_SESSION_IDLE_TTL_S=str(IDLE_TTL_S),
        PANTHEON_SESSION_WATCH_GRACE_S=str(GRACE_S),
        PANTHEON_SESSION_WATCH_KEEPALIVE_S=str(KEEPALIVE_S),
    )


@contextlib.contextmanager
def watching(server: PantheonServer, model: str, session_id: str) -> Iterator[Iterator[bytes]]:
    """A watch held open until the block ends, as the iterator of its chunks after the first; then its connection
    is closed, as a client that goes away does. (The iterator is kept alive here: httpx closes the connection when
    an iterator over a response is dropped.)"""
    with httpx.Client(timeout=30) as client:
        params = {"name": model, "session_id": session_id}
        with client.stream("GET", server.url + "/session/watch", params=params) as response:
            assert response.status_code == 200, response.read()
            chunks = response.iter_raw()
            assert next(chunks) == b": watch established\n\n"
            yield chunks


def held_until(api: httpx.Client, model: str, session_id: str, deadline: float, timeout: float = 30.0) -> None:
    """Polls until time.monotonic() passes `deadline`, failing at once if the session is released before then."""

    def still_held_past_deadline() -> bool:
        if session_id not in sessions_of(api, model):
            pytest.fail(f"session {session_id!r} was released before it should have been")
        return time.monotonic() > deadline

    wait_for(still_held_past_deadline, timeout=timeout)


def test_the_stream_is_comments_and_keepalives(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "w")
    with watching(server, "w", "k") as chunks:
        assert next(chunks) == b": keep-alive\n\n"


def test_a_watched_session_outlives_the_idle_ttl_and_goes_a_grace_period_after_the_watch_closes(
    server, api, stories_hf_dir
):
    load(api, stories_hf_dir, "w")
    converse(api, "w", USER_TURNS[:1], session_id="unwatched")
    converse(api, "w", USER_TURNS[:1], session_id="watched")
    with watching(server, "w", "watched"):
        last_turn = time.monotonic()
        wait_for(lambda: "unwatched" not in sessions_of(api, "w"))  # the idle TTL applies to it
        held_until(api, "w", "watched", last_turn + 2 * IDLE_TTL_S)
        assert sessions_of(api, "w")["watched"]["watched"]
    closed = time.monotonic()
    # The close is noticed while the session is still held (the grace period runs), and then it is released.
    wait_for(lambda: (row := sessions_of(api, "w").get("watched")) is not None and not row["watched"])
    wait_for(lambda: "watched" not in sessions_of(api, "w"))
    assert time.monotonic() - closed >= GRACE_S


def test_a_new_watch_within_the_grace_period_keeps_the_session(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "w")
    converse(api, "w", USER_TURNS[:1], session_id="again")
    with watching(server, "w", "again"):
        pass
    closed = time.monotonic()
    with watching(server, "w", "again"):
        held_until(api, "w", "again", closed + 3 * GRACE_S + IDLE_TTL_S)
        assert sessions_of(api, "w")["again"]["watched"]
    wait_for(lambda: "again" not in sessions_of(api, "w"))


def test_a_watch_may_open_before_the_sessions_first_turn(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "w")
    with watching(server, "w", "early"):
        converse(api, "w", USER_TURNS[:1], session_id="early")
        last_turn = time.monotonic()
        held_until(api, "w", "early", last_turn + 2 * IDLE_TTL_S)
    wait_for(lambda: "early" not in sessions_of(api, "w"))


def test_watches_end_with_the_connection_not_the_server(server, api, stories_hf_dir):
    """Many watches opened and dropped leave none behind: each close reached the worker."""
    load(api, stories_hf_dir, "w")
    converse(api, "w", USER_TURNS[:1], session_id="many")
    for _ in range(5):
        with watching(server, "w", "many"):
            pass
    with watching(server, "w", "many"):
        assert sessions_of(api, "w")["many"]["watched"]
    wait_for(lambda: "many" not in sessions_of(api, "w"))


def test_past_the_watch_limit_a_watch_is_503_until_one_closes(start_server, operator_token, stories_hf_dir):
    limited = start_server(PANTHEON_SESSION_MAX_WATCHES="1")
    with operator_client(limited, operator_token) as api:
        load(api, stories_hf_dir, "w")
        converse(api, "w", USER_TURNS[:1], session_id="first")
        converse(api, "w", USER_TURNS[:1], session_id="second")
        params = {"name": "w", "session_id": "second"}
        with watching(limited, "w", "first"):
            refused = httpx.get(limited.url + "/session/watch", params=params)
            assert (refused.status_code, refused.json()["error"]["type"]) == (503, "watch_unavailable")
            assert not sessions_of(api, "w")["second"]["watched"]
        # once the server has noticed the first watch close, there is room again
        wait_for(lambda: not sessions_of(api, "w")["first"]["watched"])
        with watching(limited, "w", "second"):
            assert sessions_of(api, "w")["second"]["watched"]
