"""The chaos run's counts: answers, wrong answers, errors by kind (and whether each names its cause), hangs.

An error's kind is its exception class, with the status code where it has one (ADBC's
``OperationalError(UNAVAILABLE)``). Its message is *clear* when it names its cause: a worker's URL, a
stage or task, or a reason in words (``Clarity``'s phrases: a deadline, a busy or draining worker, a
partitioned or silent peer, ...) and no Python traceback, and it is not one of Python's own
programming errors (``KeyError``, ``AttributeError``, ...: those are bugs whatever they say). Anything
else (a bare "internal error", gRPC's "Socket closed", an empty message) is *unclear*, counted apart,
and printed in full. A query that outlives the hang bound is *hung*: the summary counts it too.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Tally", "error_kind", "unclear_reason"]

_URL = re.compile(r"grpc(\+tls)?://[\w.\-\[\]:]+:\d+")
_CAUSE = re.compile(
    r"\bstage\b|\btask\b|deadline|timed? ?out|busy|draining|cancel|silent|unreachable|no worker|lost|killed|refused|"
    r"out of memory|memory|no space|disk|spill|capacity|admission|retries|unavailable worker|not reachable|partition",
    re.IGNORECASE)
_BUGS = {"KeyError", "AttributeError", "TypeError", "IndexError", "AssertionError", "NameError", "ZeroDivisionError",
         "UnboundLocalError", "RecursionError", "NotImplementedError", "StopIteration"}
_BARE = re.compile(r"^\W*(internal( error)?|unknown( error)?|error|none|socket closed|stream removed|broken pipe|"
                   r"connection reset by peer|received rst_stream|failed to connect to all addresses)\W*$", re.IGNORECASE)
EXAMPLES = 3
"""Messages kept per error kind, for the report."""


def error_kind(reply: dict[str, Any]) -> str:
    """``Type`` or ``Type(CODE)``."""
    kind = str(reply.get("type") or "?")
    return f"{kind}({reply['code']})" if reply.get("code") else kind


def unclear_reason(kind: str, message: str) -> str | None:
    """Why an error's message does not name its cause (None: it does)."""
    text = " ".join(message.split())
    if "Traceback (most recent call last)" in message:
        return "a Python traceback"
    if kind.split("(")[0] in _BUGS:
        return f"{kind.split('(')[0]}: a programming error, whatever it says"
    if not text or _BARE.match(text):
        return "no cause named"
    if _URL.search(text) or _CAUSE.search(text):
        return None
    return "names no worker, stage or reason"


@dataclass
class Tally:
    """What happened to every request, by outcome."""

    answers: int = 0
    wrong: int = 0
    hung: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unclear: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    per_query: Counter[str] = field(default_factory=Counter)
    per_way: Counter[str] = field(default_factory=Counter)

    def answer(self, query: str, way: str) -> None:
        self.answers += 1
        self.per_query[query] += 1
        self.per_way[way] += 1

    def error(self, kind: str, message: str) -> str | None:
        """Count an error; returns why it is unclear, or None."""
        self.errors[kind] += 1
        kept = self.examples.setdefault(kind, [])
        if len(kept) < EXAMPLES and message[:200] not in (m[:200] for m in kept):
            kept.append(message)
        why = unclear_reason(kind, message)
        if why is not None:
            self.unclear[kind] += 1
        return why

    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())

    @property
    def n_unclear(self) -> int:
        return sum(self.unclear.values())

    def summary(self, faults: Counter[str], leftover_tasks: int, stray: int) -> str:
        """The run's last line."""
        def kinds(c: Counter[str]) -> str:
            return f" ({', '.join(f'{k}: {n}' for k, n in c.most_common())})" if c else ""
        return (f"chaos: answers {self.answers}, wrong {self.wrong}, errors {self.n_errors}{kinds(self.errors)}, "
                f"unclear {self.n_unclear}, hung {self.hung}, faults {sum(faults.values())}{kinds(faults)}, "
                f"leftover tasks {leftover_tasks}, stray processes {stray}")

    def failed(self, leftover_tasks: int, stray: int) -> bool:
        return bool(self.wrong or self.n_unclear or self.hung or leftover_tasks or stray)
