"""A JSON Schema as llguidance Lark in which every number has bounded digits, for the grammars that constrain JSON
(response_format's, the tool-call grammar's arguments).

llguidance writes a schema's numbers as an unbounded regex (`-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?`, and
`(\\.[0-9]+)?` even between a minimum and a maximum) and has no option that bounds them, so a model that keeps
choosing digits writes one number until max_tokens runs out. Here a number has at most `INTEGRAL_DIGITS` integral
and `FRACTION_DIGITS` fractional digits, as llama.cpp's json-schema grammar bounds them, and an exponent of at most
`EXPONENT_DIGITS` digits (llama.cpp allows 16): every number allowed is then a finite double, the largest about
1e115, where a 3-digit exponent could overflow to infinity, which JSON cannot write back (a parsed call's arguments
are serialized again). A schema's minimum and maximum bound it tighter (fewer integral digits where they imply
them, and then no exponent, as llguidance writes a bounded number). An integer, and a number with `multipleOf`
(whose decimals bound its fraction), stays llguidance's with a minimum and maximum added where the schema has none.

How: the parts of a schema on the way to an unbounded number (objects, arrays, `anyOf`, a list of types, `$ref`,
any value) are written here as Lark rules in llguidance's own layout (properties in their order, required ones
always and optional ones maybe, extra keys after them and never a listed one, compact separators), and every part
that cannot hold one is left to llguidance as `%json {...}`, with its semantics and its warnings. A part that uses
a keyword this module does not write (`allOf`, `oneOf`, `patternProperties`, `minProperties`, `prefixItems`, ...)
is left to llguidance whole, and its numbers keep llguidance's unbounded form (docs/grammar-engine.md).
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

INTEGRAL_DIGITS = 16
FRACTION_DIGITS = 16
EXPONENT_DIGITS = 2

# The layout every constrained JSON is written in: Python's json.dumps separators and no other whitespace (free
# whitespace lets a model wander in blank space without closing anything); `lenient`: keywords llguidance cannot
# enforce become warnings instead of errors.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}

# Keywords that do not constrain a value (llguidance's list of meta-data and annotations, and `deprecated`).
ANNOTATIONS = frozenset(
    {"$anchor", "$defs", "definitions", "$schema", "$id", "id", "$comment", "title", "description", "default",
     "readOnly", "writeOnly", "examples", "contentMediaType", "contentEncoding", "deprecated"}
)  # fmt: skip
NUMBER_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
STRING_KEYWORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
ARRAY_KEYWORDS = frozenset(
    {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains",
     "maxContains", "unevaluatedItems"}
)  # fmt: skip
OBJECT_KEYWORDS = frozenset(
    {"properties", "required", "additionalProperties", "patternProperties", "minProperties", "maxProperties",
     "propertyNames", "dependentRequired", "dependentSchemas", "unevaluatedProperties"}
)  # fmt: skip
KEYWORDS_OF = {
    "number": NUMBER_KEYWORDS, "integer": NUMBER_KEYWORDS, "string": STRING_KEYWORDS, "array": ARRAY_KEYWORDS,
    "object": OBJECT_KEYWORDS, "boolean": frozenset(), "null": frozenset(),
}  # fmt: skip
# What this module writes itself, by type; a part with any other constraining keyword is llguidance's.
WRITTEN = {
    "number": NUMBER_KEYWORDS - {"multipleOf"},
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
}

JSON_STRING = r'/"(\\(["\\\/bfnrt]|u[0-9a-fA-F]{4})|[^"\\\x00-\x1F\x7F])*"/'
UNSIGNED = r"(0|[1-9][0-9]*)(\.[0-9]+)?"  # a number without its sign; the shape intersected with it bounds its digits
FRACTION = r"(\.[0-9]+)?"


def json_schema_lark(schema: dict[str, Any]) -> str:
    """The whole Lark grammar of one JSON value that follows `schema`, numbers bounded."""
    json_lark = JsonLark()
    start = json_lark.value(schema, root=schema)
    return "\n".join([f"start: {start}", *json_lark.rules]) + "\n"


class JsonLark:
    """Lark expressions of JSON values, collecting the rules they name (add `rules` to the grammar that uses them).
    Rule and terminal names start with `json`/`JSON`."""

    def __init__(self) -> None:
        self.rules: list[str] = []
        self._count = 0
        self._refs: dict[tuple[int, str], str] = {}
        self._named: set[str] = set()
        self._resolvable: dict[int, bool] = {}
        self.item_separator = json.dumps(JSON_LAYOUT["item_separator"])
        self.key_separator = json.dumps(JSON_LAYOUT["key_separator"])

    def value(self, schema: Any, root: dict[str, Any]) -> str:
        """A Lark expression of one value that follows `schema`; `root` is the document its `$ref`s point into."""
        if not self._refs_resolvable(root) or not _unbounded(schema, root, set()):
            return self._llguidance(schema, root)
        if schema is True or set(schema) <= ANNOTATIONS:
            return self._any()
        keys = set(schema) - ANNOTATIONS
        if keys == {"$ref"}:
            return self._reference(schema["$ref"], root)
        if keys == {"anyOf"} and isinstance(schema["anyOf"], list) and schema["anyOf"]:
            return "(" + " | ".join(self.value(option, root) for option in schema["anyOf"]) + ")"
        if keys & {"$ref", "anyOf", "oneOf", "allOf", "not", "if", "then", "else"}:
            return self._llguidance(schema, root)
        kind = schema.get("type", list(KEYWORDS_OF))
        if isinstance(kind, list) and len(kind) > 1:
            return "(" + " | ".join(self.value({**schema, "type": each}, root) for each in kind) + ")"
        kind = kind[0] if isinstance(kind, list) and kind else kind
        if kind == "integer" or (kind == "number" and "multipleOf" in schema):
            return self._llguidance(_with_integral_bounds(schema), root)
        others = set().union(*(words for each, words in KEYWORDS_OF.items() if each != kind))
        written = None
        if kind in WRITTEN and keys - {"type"} - others <= WRITTEN[kind]:
            written = {"number": self._number, "object": self._object, "array": self._array}[kind](schema, root)
        return written if written is not None else self._llguidance(schema, root)

    def _name(self, kind: str) -> str:
        self._count += 1
        return f"{kind}{self._count}"

    def _rule(self, body: str) -> str:
        name = self._name("json")
        self.rules.append(f"{name}: {body}")
        return name

    def _shared(self, name: str, body: str) -> str:
        """A rule or terminal every value of this grammar uses alike (written once)."""
        if name not in self._named:
            self._named.add(name)
            self.rules.append(f"{name}: {body}")
        return name

    def _llguidance(self, schema: Any, root: dict[str, Any]) -> str:
        """`schema` compiled by llguidance, with the root's definitions and draft when it points into them."""
        if not isinstance(schema, dict):
            return f"%json {json.dumps(schema)}"
        if "$ref" in json.dumps(schema):
            schema = {**{k: root[k] for k in ("$schema", "$defs", "definitions") if k in root}, **schema}
        return f"%json {json.dumps({**schema, 'x-guidance': JSON_LAYOUT})}"

    def _refs_resolvable(self, root: dict[str, Any]) -> bool:
        if id(root) not in self._resolvable:
            self._resolvable[id(root)] = _refs_resolvable(root)
        return self._resolvable[id(root)]

    def _reference(self, ref: str, root: dict[str, Any]) -> str:
        key = (id(root), ref)
        if key not in self._refs:
            name = self._refs[key] = self._name("json")
            self.rules.append(f"{name}: {self.value(_resolve(ref, root), root)}")
        return self._refs[key]

    def _any(self) -> str:
        value, string = "json_any", self._shared("JSON_STRING", JSON_STRING)
        number = self._shared("JSON_NUMBER", f"/{_number_shape(INTEGRAL_DIGITS, exponent=True)}/")
        pair = f"{string} {self.key_separator} {value}"
        body = (f'"null" | "true" | "false" | {number} | {string} | "[" ({value} ({self.item_separator} {value})*)? "]"'
                f' | "{{" ({pair} ({self.item_separator} {pair})*)? "}}"')  # fmt: skip
        return self._shared(value, body)

    def _number(self, schema: dict[str, Any], root: dict[str, Any]) -> str | None:
        """A terminal: the bounded shape, and the schema's minimum and maximum intersected with it (None: draft 4's
        boolean exclusiveMinimum/exclusiveMaximum, an infinite bound, or an empty range, which llguidance reports)."""
        if not all(_is_number(schema[key]) for key in NUMBER_KEYWORDS & set(schema)):
            return None
        lower = _tightest(schema, "minimum", "exclusiveMinimum", max)
        upper = _tightest(schema, "maximum", "exclusiveMaximum", min)
        bounds = [bound for bound in (lower, upper) if bound is not None]
        digits = max([INTEGRAL_DIGITS] + [len(_whole_and_fraction(abs(value))[0]) for value, _ in bounds])
        parts = [_number_shape(digits, exponent=not bounds)]
        if lower is not None:
            parts.append(_above(*lower))
        if upper is not None:
            parts.append(_below(*upper))
        if lower and upper and (lower[0] > upper[0] or lower[0] == upper[0] and (lower[1] or upper[1])):
            return None
        terminal = self._name("JSON")
        self.rules.append(f"{terminal}: " + " & ".join(f"/{part}/" for part in parts))
        return terminal

    def _object(self, schema: dict[str, Any], root: dict[str, Any]) -> str | None:
        properties, required = schema.get("properties", {}), schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if (
            not isinstance(properties, dict)
            or not isinstance(required, list)
            or extra is False
            and any(name not in properties for name in required)
        ):
            return None
        items: list[tuple[str, bool]] = []
        for name in [*properties, *(name for name in required if name not in properties)]:
            property_schema = properties.get(name, extra)
            if property_schema is False:
                if name in required:
                    return None
                continue
            key = json.dumps(json.dumps(name, ensure_ascii=False))
            items.append((f"{key} {self.key_separator} {self.value(property_schema, root)}", name in required))
        if extra is not False:
            key = self._shared("JSON_STRING", JSON_STRING)
            taken = [json.dumps(json.dumps(name, ensure_ascii=False)) for name in [*properties, *required]]
            if taken:
                key = self._name("JSON")
                self.rules.append(f"{key}: JSON_STRING & ~({' | '.join(dict.fromkeys(taken))})")
            pair = self._rule(f"{key} {self.key_separator} {self.value(extra, root)}")
            items.append((f"{pair} ({self.item_separator} {pair})*", False))
        if not items:
            return '"{}"'
        first = self._fields(items)
        return f'"{{" {first} "}}"' if any(req for _, req in items) else f'"{{" {first}? "}}"'

    def _fields(self, items: list[tuple[str, bool]]) -> str:
        """A rule for the fields from the first present one on (never empty): a field after another is written
        with the separator before it, required ones always and optional ones maybe (llguidance's order)."""
        (item, required), rest = items[0], items[1:]
        after = " ".join(f"{self.item_separator} {i}" if r else f"({self.item_separator} {i})?" for i, r in rest)
        body = f"{item} {after}".strip()
        if not required and rest:
            body = f"{body} | {self._fields(rest)}"
        return self._rule(body)

    def _array(self, schema: dict[str, Any], root: dict[str, Any]) -> str | None:
        items, low, high = schema.get("items", True), schema.get("minItems", 0), schema.get("maxItems")
        if isinstance(items, list) or not isinstance(low, int) or not isinstance(high, int | None):
            return None
        if high is not None and low > high:
            return None
        if high == 0 or items is False:
            return '"[]"' if low == 0 else None
        item = self._rule(self.value(items, root))
        more = f"{{{max(low - 1, 0)},{'' if high is None else high - 1}}}"
        sequence = f"{item} ({self.item_separator} {item}){more}"
        return f'"[" {sequence} "]"' if low > 0 else f'"[" ({sequence})? "]"'


def _unbounded(schema: Any, root: dict[str, Any], seen: set[str]) -> bool:
    """Whether llguidance's grammar for `schema` may write a number of unbounded length (an over-estimate: a part
    that only may, such as one branch of an allOf, counts)."""
    if schema is True:
        return True
    if not isinstance(schema, dict) or "const" in schema or "enum" in schema:
        return False
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref not in seen:
        seen.add(ref)
        if _unbounded(_resolve(ref, root), root, seen):
            return True
    for combinator in ("anyOf", "oneOf", "allOf"):
        if any(_unbounded(option, root, seen) for option in schema.get(combinator) or []):
            return True
    if "type" not in schema and set(schema) & {"$ref", "anyOf", "oneOf", "allOf"}:
        return False
    kinds = schema.get("type", list(KEYWORDS_OF))
    kinds = {kinds} if isinstance(kinds, str) else set(kinds)
    bounded_integer = {"minimum", "exclusiveMinimum"} & set(schema) and {"maximum", "exclusiveMaximum"} & set(schema)
    if "number" in kinds or ("integer" in kinds and not bounded_integer):
        return True
    if "object" in kinds:
        nested = [*(schema.get("properties") or {}).values(), *(schema.get("patternProperties") or {}).values()]
        if any(_unbounded(part, root, seen) for part in [*nested, schema.get("additionalProperties", True)]):
            return True
    if "array" in kinds:
        items = schema.get("items", True)
        parts = [*(items if isinstance(items, list) else [items]), *(schema.get("prefixItems") or [])]
        if any(_unbounded(part, root, seen) for part in parts):
            return True
    return False


def _refs_resolvable(root: dict[str, Any]) -> bool:
    """Whether every `$ref` in `root` names one of its own definitions (`#/$defs/NAME`, `#/definitions/NAME`), the
    only ones a part compiled apart from the rest still finds."""

    def resolvable(node: Any) -> bool:
        if isinstance(node, list):
            return all(resolvable(item) for item in node)
        if not isinstance(node, dict):
            return True
        return all(_resolve(v, root) is not None if k == "$ref" else resolvable(v) for k, v in node.items())

    return resolvable(root)


def _resolve(ref: Any, root: dict[str, Any]) -> Any:
    """The definition `ref` names in `root`, or None."""
    for prefix in ("#/$defs/", "#/definitions/"):
        if isinstance(ref, str) and ref.startswith(prefix):
            definitions = root.get(prefix[2:-1])
            if isinstance(definitions, dict):
                return definitions.get(ref[len(prefix) :])
    return None


def _with_integral_bounds(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with a minimum and a maximum where it has none: as many integral digits as its own bounds have, at
    least INTEGRAL_DIGITS."""
    bounds = [schema[key] for key in NUMBER_KEYWORDS - {"multipleOf"} if _is_number(schema.get(key))]
    digits = max([INTEGRAL_DIGITS] + [len(_whole_and_fraction(abs(Decimal(repr(b))))[0]) for b in bounds])
    widest = 10**digits - 1
    bounded = dict(schema)
    if "minimum" not in schema and "exclusiveMinimum" not in schema:
        bounded["minimum"] = -widest
    if "maximum" not in schema and "exclusiveMaximum" not in schema:
        bounded["maximum"] = widest
    return bounded


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _tightest(schema: dict[str, Any], inclusive: str, exclusive: str, pick) -> tuple[Decimal, bool] | None:
    """The bound on one side as (value, strict), the tighter of the inclusive and the exclusive keyword."""
    candidates = [(Decimal(repr(schema[key])), key == exclusive) for key in (exclusive, inclusive) if key in schema]
    if not candidates:
        return None
    best = pick(value for value, _ in candidates)
    return best, any(strict for value, strict in candidates if value == best)


def _number_shape(integral_digits: int, *, exponent: bool) -> str:
    shape = rf"-?(0|[1-9][0-9]{{0,{integral_digits - 1}}})(\.[0-9]{{1,{FRACTION_DIGITS}}})?"
    return shape + (rf"([eE][+-]?[0-9]{{1,{EXPONENT_DIGITS}}})?" if exponent else "")


def _above(bound: Decimal, strict: bool) -> str | None:
    """A regex of the numbers (sign and all) at least `bound` (above it when strict), without an exponent."""
    if bound >= 0:
        return _at_least(bound, strict)
    return f"{UNSIGNED}|-({_at_most(-bound, strict)})"


def _below(bound: Decimal, strict: bool) -> str | None:
    """A regex of the numbers at most `bound` (below it when strict), without an exponent."""
    if bound < 0:
        return f"-({_at_least(-bound, strict)})"
    negative = f"-({_at_least(Decimal(0), strict=True)})"  # "-0" is not below 0
    at_most = _at_most(bound, strict)
    return negative if at_most is None else f"{at_most}|{negative}"


def _alternatives(options: list[str]) -> str | None:
    return "|".join(f"({option})" for option in options) if options else None


def _whole_and_fraction(value: Decimal) -> tuple[str, str]:
    """A non-negative decimal as its integral digits (no leading zeros, "0" for none) and its fractional digits
    (no trailing zeros)."""
    whole, _, fraction = format(value, "f").partition(".")
    return whole.lstrip("0") or "0", fraction.rstrip("0")


def _at_least(bound: Decimal, strict: bool) -> str | None:
    """Unsigned decimals (`0|[1-9][0-9]*` and maybe a fraction) at least `bound` >= 0 (above it when strict)."""
    whole, fraction = _whole_and_fraction(bound)
    options = [f"({_whole_above(whole)}){FRACTION}"]
    if fraction:
        options.append(rf"{whole}\.({_fraction_at_least(fraction, strict)})")
    else:
        options.append(rf"{whole}\.[0-9]*[1-9][0-9]*" if strict else f"{whole}{FRACTION}")
    return _alternatives(options)


def _at_most(bound: Decimal, strict: bool) -> str | None:
    """Unsigned decimals at most `bound` >= 0 (below it when strict); None when there are none."""
    whole, fraction = _whole_and_fraction(bound)
    options = []
    below = _whole_below(whole)
    if below is not None:
        options.append(f"({below}){FRACTION}")
    if fraction:
        smaller = _fraction_at_most(fraction, strict)
        options.append(rf"{whole}(\.({smaller}))?" if smaller is not None else whole)
    elif not strict:
        options.append(rf"{whole}(\.0+)?")
    return _alternatives(options)


def _whole_above(whole: str) -> str:
    """Integral digits (no leading zeros) of a larger integer than `whole`."""
    options = [f"[1-9][0-9]{{{len(whole)},}}"]
    for i, digit in enumerate(whole):
        if digit != "9":
            options.append(f"{whole[:i]}[{int(digit) + 1}-9][0-9]{{{len(whole) - i - 1}}}")
    return _alternatives(options)


def _whole_below(whole: str) -> str | None:
    """Integral digits (no leading zeros) of a smaller non-negative integer than `whole`; None below 0."""
    if whole == "0":
        return None
    options = ["0"] + ([f"[1-9][0-9]{{0,{len(whole) - 2}}}"] if len(whole) > 1 else [])
    for i, digit in enumerate(whole):
        lowest = 1 if i == 0 else 0
        if int(digit) > lowest:
            options.append(f"{whole[:i]}[{lowest}-{int(digit) - 1}][0-9]{{{len(whole) - i - 1}}}")
    return _alternatives(options)


def _fraction_at_least(fraction: str, strict: bool) -> str:
    """Fractional digits (one or more) whose value is at least 0.`fraction` (above it when strict); `fraction` has
    no trailing zeros."""
    first, rest = int(fraction[0]), fraction[1:]
    options = [f"[{first + 1}-9][0-9]*"] if first < 9 else []
    if rest:
        options.append(f"{first}({_fraction_at_least(rest, strict)})")
    else:
        options.append(f"{first}[0-9]*[1-9][0-9]*" if strict else f"{first}[0-9]*")
    return _alternatives(options)


def _fraction_at_most(fraction: str, strict: bool) -> str | None:
    """Fractional digits (one or more) whose value is at most 0.`fraction` (below it when strict); None when none."""
    first, rest = int(fraction[0]), fraction[1:]
    options = [f"[0-{first - 1}][0-9]*"] if first > 0 else []
    if rest:
        smaller = _fraction_at_most(rest, strict)
        options.append(f"{first}({smaller})?" if smaller is not None else f"{first}")
    elif not strict:
        options.append(f"{first}0*")
    return _alternatives(options)
