"""The service and the fleet registry fuzzed like the worker: hostile Flight SQL commands, handles, parameters,
headers, and registrations, each judged as the worker fuzzer judges (crash, hang, unclear).

``python -m benchmarks.fuzz_service`` (docs/service.md, "How the service is fuzzed"). Modules:
``sqlproto`` (Flight SQL's messages, by path), the families ``envelopes``, ``prepared``, ``headers`` and
``registry``, ``generator``, ``runner``, ``fuzzer`` and ``cli``; ``registry_server`` is the process
that serves a registry for it (the one module here that imports ``flight``, in that process only).
"""

from __future__ import annotations

from benchmarks.fuzz.service.cli import main
from benchmarks.fuzz.service.generator import REGISTRY_FAMILIES, SERVICE_FAMILIES, ServiceGenerator

__all__ = ["REGISTRY_FAMILIES", "SERVICE_FAMILIES", "ServiceGenerator", "main"]
