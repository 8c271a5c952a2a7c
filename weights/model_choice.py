"""Which served model a weights call is for (docs/weights.md, "Which model a call is for").

Pantheon serves several models at once (`./scripts/serve` always serves `demo`), so one rule decides, the same for
every route: a call that names a model (body field `model`, or query parameter `model`) is for that model, by its
served name or the name its weights answer under; a call that names none is for the default, which is the attached
model while an attachment exists (one at a time, over every model), else the only attachable model served, else the
only model served. With no default, a call must name its model (400 MODEL_NOT_LOADED says which are served).
"""

from __future__ import annotations

from inference.engine.contract.weights import WeightsCode
from inference.runtime.engine_client import ModelPlacement
from inference.runtime.router import ModelRouter, key_order
from weights.errors import weights_error

MODEL_NAME_MAX = 200  # a catalogue name's length (CatalogModel.name)


def requested_model(body_value: object, query_value: str | None) -> str:
    """The model a call names ("" for none), from its body field or its query parameter: a string of at most
    MODEL_NAME_MAX characters; two that differ, or any other type, are 400 INVALID_REQUEST."""
    if body_value is not None and not isinstance(body_value, str):
        raise weights_error(WeightsCode.INVALID_REQUEST, "`model` must be a string: the served name of a model")
    names = {name for name in (body_value, query_value) if name}
    if len(names) > 1:
        raise weights_error(WeightsCode.INVALID_REQUEST, "the body and the query name different models")
    name = names.pop() if names else ""
    if len(name) > MODEL_NAME_MAX:
        raise weights_error(WeightsCode.INVALID_REQUEST, f"`model` is longer than {MODEL_NAME_MAX} characters")
    return name


def attached_placement(router: ModelRouter) -> ModelPlacement | None:
    """The served model an attachment holds (active or stale), if any."""
    return next((pl for pl in router.placements().values() if pl.weights and pl.weights.attachment), None)


def served_placements(router: ModelRouter) -> dict[str, ModelPlacement]:
    """The models whose barrier can answer, by served name: those ready, each with its barrier's snapshot. A model
    with several replicas is its first (docs/replicas.md: the weights calls that change it refuse it)."""
    served: dict[str, ModelPlacement] = {}
    for pl in sorted(router.placements().values(), key=lambda pl: (pl.served_name, key_order(pl))):
        if pl.state == "ready" and pl.weights is not None:
            served.setdefault(pl.served_name, pl)
    return served


def default_placement(router: ModelRouter) -> ModelPlacement | None:
    """The model a call that names none is for: the attached one, else the only attachable one, else the only one
    served; None when there is no such model."""
    if (held := attached_placement(router)) is not None:
        return held
    served = list(served_placements(router).values())
    attachable = [pl for pl in served if pl.weights.attach_refusal is None]
    if len(attachable) == 1:
        return attachable[0]
    return served[0] if len(served) == 1 else None


def named_placement(router: ModelRouter, name: str) -> ModelPlacement:
    """The served model `name` names (its served name, or the name its weights answer under): 400
    MODEL_NOT_LOADED when none does."""
    served = served_placements(router)
    found = served.get(name) or next((pl for pl in served.values() if pl.weights.served_name == name), None)
    if found is None:
        raise weights_error(
            WeightsCode.MODEL_NOT_LOADED, f"model {name!r} is not loaded", details=_served_details(served)
        )
    return found


def call_placement(router: ModelRouter, name: str = "") -> ModelPlacement:
    """The model a call is for: the named one, else the default. 400 MODEL_NOT_LOADED when nothing is served, or
    there is no default and no model was named."""
    if name:
        return named_placement(router, name)
    if (found := default_placement(router)) is not None:
        return found
    served = served_placements(router)
    if not served:
        raise weights_error(WeightsCode.MODEL_NOT_LOADED, "no model is loaded")
    raise weights_error(
        WeightsCode.MODEL_NOT_LOADED,
        f"several models are served ({', '.join(served)}) and none is the default: name one with `model`",
        details=_served_details(served),
    )


def _served_details(served: dict[str, ModelPlacement]) -> dict[str, list[str]]:
    return {"served": list(served)}
