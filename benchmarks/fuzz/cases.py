"""``Case``: one fuzz input as JSON-able steps (a replayable corpus file), and the check that it stays on loopback."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.fuzz.proto import L, P, parse
from benchmarks.fuzz.scripts import walk
from benchmarks.fuzz.settings import FORBIDDEN_DIRS, LOOPBACK_URL

__all__ = ["Case", "all_steps", "safe_path", "unsafe_reason"]


# ---------------------------------------------------------------------- cases


@dataclass
class Case:
    """One fuzz input: steps the runner plays against the worker, and files the worker's units read."""

    family: str
    index: int
    seed: int
    note: str
    steps: list[dict[str, Any]]
    files: dict[str, bytes] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "index": self.index, "seed": self.seed, "note": self.note,
                "steps": _encode(self.steps), "files": _encode(self.files)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        return cls(data["family"], data["index"], data["seed"], data["note"], _decode(data["steps"]), _decode(data.get("files", {})))


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"b64"}:
            return base64.b64decode(value["b64"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def all_steps(steps: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for step in steps:
        yield step
        yield from all_steps(step.get("script", []))


def unsafe_reason(case: Case) -> str | None:
    """Why the worker could be made to reach beyond this machine's loopback and scratch files, or None."""
    for step in all_steps(case.steps):
        why = None
        if step["op"] == "exchange":
            why = _unsafe_header(step["cmd"])
        elif step["op"] in ("frame", "batch_frame"):
            why = _unsafe_frame(step["data"])
        if why:
            return why
    bad = [name for name in case.files if "/" in name or name.startswith(".")]
    return f"file {bad[0]!r}" if bad else None


def _unsafe_header(cmd: bytes) -> str | None:
    header = parse(P.TaskHeader, cmd)
    plan = parse(L.StagePlan, header.plan) if header is not None else None
    if plan is None:
        return None
    for message in walk(plan, skip=("Expression",)):
        url = str(getattr(message, "url", ""))
        if message.DESCRIPTOR.name == "ProducerTask" and not LOOPBACK_URL.fullmatch(url):
            return f"shuffle read from {url[:60]!r}"
    return None


def _unsafe_frame(data: bytes) -> str | None:
    frame = parse(P.CoordinatorFrame, data)
    if frame is None or frame.WhichOneof("frame") != "units":
        return None  # only units carry bodies a reader opens
    for body in {u.body for u in frame.units.units if b":" in u.body or b"/" in u.body}:
        unit = parse(L.FileUnit, body)
        if unit is not None and unit.path and not safe_path(unit.path):
            return f"work unit path {unit.path[:60]!r}"
    return None


def safe_path(path: str) -> bool:
    """Local, and not a device or kernel file: no URI scheme (``s3://``, ``hdfs:``), nothing under /dev, /proc, /sys."""
    if ":" in path or "\x00" in path:
        return False
    resolved = os.path.normpath(os.path.join("/scratch/fuzz", path))
    return not any(resolved == d or resolved.startswith(d + "/") for d in FORBIDDEN_DIRS)
