"""Cases for the service and the registry: case ``i`` of a seed depends on the seed and ``i`` only, as the worker's."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.fuzz.cases import Case
from benchmarks.fuzz.generator import GENERATION_ERRORS
from benchmarks.fuzz.mutator import Mutator, weighted
from benchmarks.fuzz.service.envelopes import command_case
from benchmarks.fuzz.service.headers import headers_case
from benchmarks.fuzz.service.prepared import params_case, prepared_case
from benchmarks.fuzz.service.registry import register_case
from benchmarks.fuzz.service.sqlproto import S, pack

__all__ = ["REGISTRY_FAMILIES", "SERVICE_FAMILIES", "CaseMaker", "ServiceGenerator"]

CaseMaker = Callable[[random.Random, Mutator], list[dict[str, Any]]]
SERVICE_FAMILIES: dict[str, tuple[float, CaseMaker]] = {
    "command": (40, command_case), "prepared": (20, prepared_case), "params": (20, params_case), "headers": (20, headers_case),
}
REGISTRY_FAMILIES: dict[str, tuple[float, CaseMaker]] = {"register": (1, register_case)}


class ServiceGenerator:
    """Case ``index`` of ``seed`` among ``families`` (a name: weight and maker table), drawn from its own ``random.Random``."""

    def __init__(self, seed: int, families: Mapping[str, tuple[float, CaseMaker]], only: Sequence[str] | None = None,
                 namespace: str = "service") -> None:
        self.seed = seed
        self.namespace = namespace
        self.families = {name: entry for name, entry in families.items() if not only or name in only}
        if not self.families:
            raise ValueError(f"no such families {only}; known: {', '.join(families)}")
        self.donors = [pack(S.CommandStatementQuery(query="SELECT 1")), pack(S.CommandGetTables(include_schema=True))]

    def case(self, index: int) -> Case:
        rng = random.Random(f"flight-exec-fuzz-{self.namespace}/{self.seed}/{index}")
        family = str(weighted(rng, [(name, weight) for name, (weight, _) in self.families.items()]))
        make = self.families[family][1]
        for _ in range(20):
            m = Mutator(rng, self.donors)
            try:
                steps = make(rng, m)
            except GENERATION_ERRORS:
                continue  # a corruption the client side cannot build: draw again
            return Case(family, index, self.seed, "; ".join(m.notes) or "unmutated", steps)
        raise RuntimeError(f"case {index} of seed {self.seed}: no {family} input could be built in 20 draws")
