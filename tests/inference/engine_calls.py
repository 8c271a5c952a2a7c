"""Calling the engine client from tests in a few words: build the SUBMIT or the LOAD from keyword arguments, and
read an EngineError as the client would see it (the API error type and status the control plane maps it to)."""

from __future__ import annotations

import uuid

from inference.engine.contract import messages as p
from inference.engine.contract.params import GenerationOptions, LoadOptions, SamplingParams, ServingLimits
from inference.runtime.client_protocol import EngineClient
from inference.runtime.generation import EngineError, Generation
from inference.services.refusals import as_api_error

LIMIT_FIELDS = set(ServingLimits.__struct_fields__)
OPTION_FIELDS = set(GenerationOptions.__struct_fields__)


def submit(model: str, *, sampling: dict | None = None, request_id: str | None = None, **fields) -> p.Submit:
    """A SUBMIT for `model`; `sampling` holds SamplingParams fields, and the fields of GenerationOptions (max_tokens,
    ignore_eos, ...) go to its `options`."""
    options = GenerationOptions(**{k: fields.pop(k) for k in OPTION_FIELDS & fields.keys()})
    return p.Submit(
        request_id=request_id or uuid.uuid4().hex,
        model=model,
        sampling=SamplingParams(**(sampling or {})),
        options=options,
        **fields,
    )


async def generate(client: EngineClient, model: str, **fields) -> Generation:
    return await client.generate(submit(model, **fields))


async def load(client: EngineClient, name: str, path: str, *, device=None, timeout=None, **fields) -> p.Loaded:
    """A load where scheduler numbers (max_concurrent, queue_depth, ...) are ServingLimits and the rest
    (ctx_cap, quantize, dtype, ...) LoadOptions."""
    limits = ServingLimits(**{k: v for k, v in fields.items() if k in LIMIT_FIELDS})
    options = LoadOptions(**{k: v for k, v in fields.items() if k not in LIMIT_FIELDS})
    return await client.load(name, path, options=options, limits=limits, device=device, timeout=timeout)


def seen_as(error: EngineError) -> tuple[str, int]:
    """The API error type and HTTP status a client gets for `error`."""
    api_error = as_api_error(error)
    return api_error.type, api_error.status
