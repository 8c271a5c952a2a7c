"""The tools the tool-calling tests offer: bounded schemas, so a constrained random-weight model always finishes its
call within a test's token budget (an unbounded string or number may run on for as long as the noise likes)."""

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 8},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": -9, "maximum": 9},
        "b": {"type": "integer", "minimum": -99, "maximum": 99},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
# Numbers only, two of them unbounded by their schema: only the grammar's bound on a number's digits lets a model that
# keeps choosing digits finish this call (contract/json_grammar.py).
MEASURE = {
    "type": "object",
    "properties": {
        "length": {"type": "number"},
        "count": {"type": "integer"},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["length", "count", "ratio"],
    "additionalProperties": False,
}
MEASURE_TOOL = {"type": "function", "function": {"name": "measure", "description": "Measure", "parameters": MEASURE}}
