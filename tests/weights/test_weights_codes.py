"""The weights refusal codes: one enum, every code with its HTTP status, and no way for a code outside the enum to
reach a client (once it did, as a 500 a trainer could not tell from a crash)."""

from __future__ import annotations

import msgspec
import pytest

from inference.engine.contract import messages as p
from inference.engine.contract.weights import WeightsCode
from weights.errors import STATUS, weights_error


@pytest.mark.parametrize("code", list(WeightsCode))
def test_every_code_has_its_status_and_goes_out_in_the_envelope(code):
    error = weights_error(code, "refused")
    assert error.status == STATUS[code]
    assert 400 <= error.status < 600
    assert error.code == code.value


def test_the_status_table_names_no_code_outside_the_enum():
    assert set(STATUS) == set(WeightsCode)


def test_a_code_outside_the_enum_is_refused_before_it_becomes_a_status():
    with pytest.raises(ValueError):
        weights_error("NOT_A_CODE", "refused")


def test_a_worker_refusal_with_an_unknown_code_does_not_decode():
    known = p.WeightsRefused(request_id="r1", code=WeightsCode.NOT_ATTACHED, message="nothing is attached")
    assert p.decode_from_worker(p.encode(known)).code is WeightsCode.NOT_ATTACHED
    unknown = msgspec.msgpack.encode(msgspec.structs.replace(known, code="NOT_A_CODE"))
    with pytest.raises(p.ProtocolError):
        p.decode_from_worker(unknown)
