"""Family ``register``: the fleet registry's ``register`` action (``flight/spark/_fleet.py``) sent hostile JSON bodies.

Why: the registry listens in the Spark driver for whoever reaches it; an executor's task sends
``{secret, url, index, attempt}``. Without the fleet's secret nothing may register, and no body
(bad JSON, wrong types, huge, deep, hostile URLs) may crash the driver's server, hang it, or
come back as a traceback or an echo of the secret. Most cases carry the right secret, so that the
fields behind its check are reached too.
"""

from __future__ import annotations

import json
import random
from typing import Any

from benchmarks.fuzz.mutator import Mutator
from benchmarks.fuzz.scripts import op

__all__ = ["HEALTH_INDEX", "REGISTRY_SECRET", "REGISTRY_WORKERS", "URLS", "register_case", "valid_body"]

REGISTRY_SECRET = "fuzz-fleet-secret-0123456789abcdef0123456789abcdef"
REGISTRY_WORKERS = 4
HEALTH_INDEX = REGISTRY_WORKERS - 1
"""The task index only the check after each case registers (cases use the others): no case can replace it."""
URLS = ["file:///etc/passwd", "grpc://evil.example:443", "grpc://127.0.0.1:0", "grpc://127.0.0.1:99999", "grpc://[::1]:1", "grpc://[::1", "",
        "grpc://" + "a" * 290 + ":1", "grpc://" + "a" * 5_000 + ":1", "grpc://user:pw@127.0.0.1:1", "grpc://127.0.0.1:1/path?q=1", " ",
        "grpc://127.0.0.1:1\x00", "grpc://\u0430pple.com:1", "GRPC://LOCALHOST:1", "grpc+tls://127.0.0.1:1", "http://127.0.0.1:1",
        "127.0.0.1:-1", "grpc://127.0.0.1:1\ngrpc://evil:1", "grpc://:1", "grpc://127.0.0.1", "grpc://127.0.0.1:1e3", "\ud800", "%00"]
VALUES: list[Any] = [None, True, False, 0, -1, 1.5, 2**64, -(2**63), 10**400, "0", "", [], {}, [1], {"a": 1}, "\ud800", "x" * 3_000, 1e308]


def valid_body(index: int = 0, attempt: int = 0, url: str = "grpc://127.0.0.1:5000") -> dict[str, Any]:
    return {"secret": REGISTRY_SECRET, "index": index, "attempt": attempt, "url": url}


def _deep(rng: random.Random) -> bytes:
    depth = rng.choice([100, 999, 1_001, 2_000, 4_000])
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    inner = b'{"a":' * depth + b"1" + b"}" * depth
    return b'{"secret": "' + REGISTRY_SECRET.encode() + b'", "index": ' + inner + b"}"


def _body(rng: random.Random, m: Mutator) -> bytes:
    kind = rng.choice(["field", "field", "field", "url", "url", "secret", "json", "deep", "huge", "extra", "replaced", "valid"])
    body = valid_body(rng.randrange(HEALTH_INDEX), rng.choice([0, 1, 3]))
    m.note(f"register: {kind}")
    if kind == "field":
        name = rng.choice(["index", "attempt", "url", "secret"])
        if rng.random() < 0.2:
            del body[name]
        else:
            body[name] = rng.choice(VALUES)
    elif kind == "url":
        body["url"] = rng.choice(URLS)
    elif kind == "secret":
        body["secret"] = rng.choice([REGISTRY_SECRET[:-1], REGISTRY_SECRET + "x", REGISTRY_SECRET.upper(), "\ud800" + REGISTRY_SECRET,
                                     REGISTRY_SECRET + "\x00", "x" * 4_000, ""])
    elif kind == "json":
        text = json.dumps(body).encode()
        return bytes(rng.choice([text[: rng.randrange(len(text))], b"", b"null", b"[]", b'"x"', b"\xff\xfe" + text, text + b"garbage",
                                 text.replace(b'"index"', b'"index": 1, "index"'), m.raw(text, "body"), b"NaN", b"1" * 4_000]))
    elif kind == "deep":
        return _deep(rng)
    elif kind == "huge":
        body["pad"] = "p" * rng.choice([3_900, 4_000, 4_100, 1 << 20])
    elif kind == "extra":
        body.update({f"k{i}": i for i in range(rng.choice([10, 300]))})
    elif kind == "replaced":
        body["attempt"] = -1 if rng.random() < 0.5 else 0
    return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def register_case(rng: random.Random, m: Mutator) -> list[dict[str, Any]]:
    """A valid registration first (so that replacing attempts and renewals have one to meet), then a hostile one."""
    kind = rng.choice(["register"] * 9 + ["other-action"])
    steps = [op("register", type="register", body=json.dumps(valid_body(1, 2)).encode())]
    if kind == "other-action":
        m.note("registry: another action")
        return steps + [op("register", type=rng.choice(["", "Register", "register\x00", "x" * 70_000, "health"]), body=b"{}")]
    return steps + [op("register", type="register", body=_body(rng, m))]
