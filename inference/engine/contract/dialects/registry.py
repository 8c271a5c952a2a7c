"""Every dialect by name, and the order in which a chat template's markup decides one (tool_prompt.py): the first
dialect whose markup the template writes (`<function=` before `<tool_call>`, which Qwen3-Coder's template writes
too)."""

from __future__ import annotations

from inference.engine.contract.dialects.base import Dialect, ToolDialect
from inference.engine.contract.dialects.hermes import HERMES
from inference.engine.contract.dialects.json_call import JSON
from inference.engine.contract.dialects.minicpm import MINICPM
from inference.engine.contract.dialects.qwen3_coder import QWEN3_CODER

TEMPLATE_ORDER: tuple[Dialect, ...] = (QWEN3_CODER, HERMES, MINICPM, JSON)
DIALECT: dict[ToolDialect, Dialect] = {dialect.name: dialect for dialect in TEMPLATE_ORDER}
