"""Verdicts: crash, hang, unclear or ok, from what a case saw and the health check after it.

Shared with the service fuzzer (``benchmarks.fuzz.service``): an error text is judged the same way there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.flight as fl

from benchmarks.fuzz.exchange import timed_out
from benchmarks.fuzz.proto import REPO_ROOT
from benchmarks.fuzz.settings import MAX_MESSAGE

if TYPE_CHECKING:
    from benchmarks.fuzz.exchange import Outcome, Status

__all__ = ["Verdict", "check_health", "classify", "clean_message", "status_reasons", "text_reasons", "unclear_verdict"]


# ------------------------------------------------------------------ verdicts

_CUTS = (". Detail:", "\nDetail:", ". gRPC client debug context", ". Client context:")
_CODE_PATH = re.compile(r"site-packages|dist-packages|\.pyx?\b\"?, line \d+|" + re.escape(str(REPO_ROOT)))


_METADATA_LIMIT = "received metadata size exceeds"


def clean_message(text: str) -> str:
    """A status as a client shows it: the text before pyarrow's appended detail (docs/protocol.md, section 10).

    gRPC itself refuses a call whose headers pass its metadata limit before any handler runs; between
    its soft and hard limit it refuses at random. Its text names the cause and sizes first and then
    lists every header's size, as long as the headers are many: the cause is what a reader sees.
    """
    for cut in _CUTS:
        text = text.split(cut)[0]
    if _METADATA_LIMIT in text:
        text = text.split(";", 1)[0]
    return text.strip()


def text_reasons(text: str) -> list[str]:
    reasons = []
    if "Traceback" in text or 'File "' in text:
        reasons.append("traceback")
    if _CODE_PATH.search(text):
        reasons.append("code-path")
    if len(text) > MAX_MESSAGE:
        reasons.append("too-long")
    return reasons


def status_reasons(status: Status) -> list[str]:
    """Why an error status would leave its reader unsure what was wrong with their input.

    The status text is judged as a client shows it (before pyarrow's ``". Detail:"``), except
    for tracebacks: a handler that lets a non-Flight exception escape makes pyarrow append its
    Python traceback (with file paths) to the text every client receives.
    """
    text = clean_message(status.message)
    reasons = text_reasons(text) + (text_reasons(status.info) if status.info else [])
    if "Traceback" in status.message and "traceback" not in reasons:
        reasons.append("traceback")
    if status.kind == "FlightInternalError" and "[field:" not in text:
        reasons.append("internal-no-field")
    if "internal error" in text.lower() and "[field:" not in text:
        reasons.append("internal-no-field")
    if status.kind == "ArrowInvalid" and "[field:" not in text and "Detail:" in status.message:
        reasons.append("invalid-no-field")
    raised = _raised_type(status.message)
    if raised and not raised.startswith(("pyarrow.", "flight.")) and "Python exception" in status.message:
        reasons.append("untranslated-exception")
    return reasons


def _raised_type(message: str) -> str:
    """The type of the exception a Python traceback in a status's detail ends with, if any."""
    detail = message.split("Detail: Python exception: Traceback", 1)
    if len(detail) < 2:
        return ""
    lines = detail[1].split(". gRPC client debug context")[0].splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    # After the last frame come its indented source lines, then "Type: message" (which may span lines).
    for line in lines[frames[-1] + 1 if frames else 0:]:
        if line and not line.startswith(" "):
            match = re.match(r"^([A-Za-z_][\w.]*)(:|$)", line)
            return match.group(1) if match else ""
    return ""


@dataclass(frozen=True)
class Verdict:
    kind: str  # "ok", "crash", "hang", "unclear"
    detail: str = ""
    reason: str = ""


def unclear_verdict(out: Outcome) -> Verdict | None:
    for status in out.statuses:
        reasons = status_reasons(status)
        if reasons:
            return Verdict("unclear", f"{status.call} {status.kind}: {clean_message(status.message)[:300]}", reasons[0])
    for message in out.error_infos:
        reasons = text_reasons(message)
        if reasons:
            return Verdict("unclear", f"ErrorInfo: {message[:300]}", reasons[0])
    if out.bad_frames:
        return Verdict("unclear", out.bad_frames[0], "unparsable-worker-frame")
    return None


def classify(out: Outcome, died: str | None, health: str) -> Verdict:
    if died:
        return Verdict("crash", died, "died")
    if health == "timeout":
        return Verdict("hang", "health did not answer in time", "health-timeout")
    if health != "ok":
        return Verdict("crash", f"health: {health}", "health-failed")
    if out.wedged:
        return Verdict("hang", "the case's calls did not return (watchdog)", "wedged")
    if out.timeouts:
        return Verdict("hang", out.timeouts[0], "deadline")
    return unclear_verdict(out) or Verdict("ok")


def check_health(client: fl.FlightClient, timeout: float) -> str:
    """``ok``, ``timeout``, or why health failed."""
    try:
        results = list(client.do_action(fl.Action("health", b""), options=fl.FlightCallOptions(timeout=timeout)))
    except (pa.ArrowException, OSError) as exc:
        if timed_out(exc):
            return "timeout"
        return f"{type(exc).__name__}: {clean_message(str(exc))[:200]}"
    body = results[0].body.to_pybytes() if results else b""
    return "ok" if body == b"ok" else f"unexpected answer {body[:50]!r}"
