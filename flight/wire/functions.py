"""The whitelist of ``pyarrow.compute`` functions a plan may call.

Both sides read this one table: the coordinator's builder refuses to emit a call
outside it (``PlanError``) and the worker's decoder refuses to run one
(``ProtocolError``). A worker therefore never resolves a name it was sent
unless the name is listed here, and each entry says which typed options
message (a field of the ``FunctionOptions`` oneof in ``plan.proto``) the
function accepts, so no free-form options ever cross the wire.

``lookup`` raises ``ValueError`` with a full-sentence message; callers turn it
into their side's error type (``raise PlanError(...) from exc`` /
``raise ProtocolError(..., field=...) from exc``).

``and_kleene`` and ``or_kleene`` are n-ary in the plan (``NARY_FUNCTIONS``): they
are associative, so the builder folds ``a & b & c`` into one call of three
arguments and the worker evaluates it as a balanced tree of pyarrow's binary
function. Every other function keeps pyarrow's own arity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["FUNCTIONS", "NARY_FUNCTIONS", "FunctionSpec", "lookup"]


@dataclass(frozen=True)
class FunctionSpec:
    """What a whitelisted function accepts.

    ``options`` is the name of the ``FunctionOptions`` oneof field the function
    takes (``"cast"``, ``"set_lookup"``, ``"match_substring"``, ``"slice"``,
    ``"round"``, ``"null"``, ``"pad"``, ``"replace_substring"``, ``"trim"``, ``"join"``,
    ``"round_temporal"``, ``"strftime"``, ``"strptime"``, ``"struct_field"``, ``"list_slice"``) or ``None`` when it takes no options.
    ``max_args`` is ``None`` for variadic functions.
    """

    name: str
    options: str | None = None
    min_args: int = 1
    max_args: int | None = 1
    options_required: bool = False

    def accepts_arity(self, count: int) -> bool:
        """Whether ``count`` arguments fit this function."""
        return count >= self.min_args and (self.max_args is None or count <= self.max_args)

    def arity_text(self) -> str:
        """The accepted argument count in words, for error messages."""
        if self.max_args is None:
            return f"at least {self.min_args}"
        if self.max_args == self.min_args:
            return f"exactly {self.min_args}"
        return f"{self.min_args} to {self.max_args}"


def _unary(*names: str, options: str | None = None, required: bool = False) -> list[FunctionSpec]:
    return [FunctionSpec(n, options, 1, 1, required) for n in names]


def _binary(*names: str) -> list[FunctionSpec]:
    return [FunctionSpec(n, None, 2, 2) for n in names]


_SPECS: list[FunctionSpec] = [
    # comparisons
    *_binary("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"),
    # boolean logic
    *_binary("and", "or", "xor", "and_not", "and_not_kleene"),
    FunctionSpec("and_kleene", None, 2, None),  # n-ary in the plan: see NARY_FUNCTIONS
    FunctionSpec("or_kleene", None, 2, None),
    *_unary("invert"),
    # arithmetic
    *_binary(
        "add", "add_checked", "subtract", "subtract_checked", "multiply", "multiply_checked",
        "divide", "divide_checked", "power", "power_checked",
    ),
    *_binary("bit_wise_and", "bit_wise_or", "bit_wise_xor", "shift_left", "shift_right"),
    *_unary("negate", "negate_checked", "abs", "abs_checked", "sqrt", "sqrt_checked", "floor", "ceil"),
    *_unary("round", options="round"),
    *_unary("ln", "log10", "log2", "exp", "sign", "trunc"),
    *_binary("logb"),
    FunctionSpec("max_element_wise", None, 1, None),  # SQL's greatest: nulls skipped
    FunctionSpec("min_element_wise", None, 1, None),  # SQL's least
    # set membership
    *_unary("is_in", options="set_lookup", required=True),
    # pattern matching
    *_unary(
        "match_like", "match_substring", "starts_with", "ends_with", "match_substring_regex",
        options="match_substring", required=True,
    ),
    *_unary("count_substring_regex", options="match_substring", required=True),  # SQL's regexp_count
    # strings
    *_unary("utf8_slice_codeunits", options="slice", required=True),
    *_unary(
        "utf8_upper", "utf8_lower", "utf8_length", "binary_length", "utf8_trim_whitespace", "utf8_ltrim_whitespace",
        "utf8_rtrim_whitespace", "utf8_reverse",
    ),
    *_binary("binary_repeat"),
    *_unary("utf8_lpad", "utf8_rpad", options="pad", required=True),
    *_unary("replace_substring", "replace_substring_regex", options="replace_substring", required=True),
    *_unary("utf8_trim", "utf8_ltrim", "utf8_rtrim", options="trim", required=True),
    FunctionSpec("binary_join_element_wise", "join", 2, None),  # strings..., separator last
    # casts ("cast" is pyarrow's meta function; the engine builds it with Expression.cast)
    *_unary("cast", options="cast", required=True),
    # date and time parts
    *_unary(
        "year", "month", "day", "day_of_week", "day_of_year", "quarter",
        "hour", "minute", "second", "iso_year",
    ),
    *_unary("floor_temporal", options="round_temporal", required=True),
    *_unary("strftime", options="strftime", required=True),
    *_unary("strptime", options="strptime", required=True),
    # nested data
    *_unary("struct_field", options="struct_field", required=True),
    *_unary("list_slice", options="list_slice", required=True),
    *_binary("list_element"),  # a list and an index (0-based); past the end an error: index a list_slice
    *_unary("list_value_length"),
    # conditionals
    FunctionSpec("if_else", None, 3, 3),
    FunctionSpec("coalesce", None, 1, None),
    # null tests
    *_unary("is_null", options="null"),
    *_unary("is_valid", "is_nan", "true_unless_null"),
]

FUNCTIONS: Mapping[str, FunctionSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})

NARY_FUNCTIONS: frozenset[str] = frozenset({"and_kleene", "or_kleene"})
"""Associative functions that take two or more arguments in the plan (binary in pyarrow)."""


def lookup(name: str) -> FunctionSpec:
    """The spec of whitelisted function ``name``.

    Raises ``ValueError`` (never ``KeyError``) naming the function when it is
    not whitelisted; callers re-raise it as their own error type.
    """
    spec = FUNCTIONS.get(name)
    if spec is None:
        raise ValueError(
            f"function {name!r} is not an allowed function; "
            "only the pyarrow.compute functions listed in flight.wire.functions.FUNCTIONS may be called."
        )
    return spec
