"""The fleet registry's ``register`` body, hostile (``flight/spark/_fleet.py``; no Spark needed, no sockets).

Each case is one the service fuzzer's ``register`` family found (``python -m benchmarks.fuzz_service``):
the refusal must be a ``ValueError`` or ``PermissionError`` naming the field, never another exception
(pyarrow would send its traceback to the caller) nor an echo of what was sent.
"""

from __future__ import annotations

import json

import pytest

from flight.spark._fleet import MAX_BODY, Registry

SECRET = "s" * 64


def body(**fields: object) -> bytes:
    return json.dumps({"secret": SECRET, "index": 0, "attempt": 0, "url": "grpc://127.0.0.1:9000", **fields}).encode()


@pytest.mark.parametrize("nested", [b"[" * 2_000 + b"]" * 2_000, b'{"a":' * 200 + b"[" * 1_100 + b"]" * 1_100 + b"}" * 200])
def test_json_nested_past_the_parsers_depth_is_refused_as_not_an_object(nested: bytes) -> None:
    # Within MAX_BODY, json.loads raised RecursionError, which reached the client as a traceback.
    assert len(nested) <= MAX_BODY
    with pytest.raises(ValueError, match="a registration is a JSON object"):
        Registry(SECRET, workers=2, expire=5.0).register(nested, 0.0)


@pytest.mark.parametrize("field", ["index", "attempt"])
def test_true_and_false_are_no_task_numbers(field: str) -> None:
    # JSON's true is an int to Python: {"index": true} registered task 1.
    registry = Registry(SECRET, workers=2, expire=5.0)
    for value in (True, False):
        with pytest.raises(ValueError, match=f"field '{field}'"):
            registry.register(body(**{field: value}), 0.0)
    assert registry.live(0.0) == []


def test_a_secret_with_a_lone_surrogate_is_a_wrong_secret_and_is_not_quoted() -> None:
    # "\ud800" made secret.encode() raise a UnicodeEncodeError (a ValueError) whose text quoted the character.
    with pytest.raises(PermissionError, match="does not carry this fleet's secret") as refused:
        Registry(SECRET, workers=2, expire=5.0).register(body(secret="\ud800" + SECRET), 0.0)
    assert "ud800" not in str(refused.value) and "surrogate" not in str(refused.value)
