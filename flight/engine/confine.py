"""Data confinement: the directories under which a worker's file readers may read.

A worker is started with its data roots (``flight-worker --data-root DIR``,
repeatable). Each root is resolved once, at start, with ``os.path.realpath``
(symlinks and ``..`` gone) and must be an existing directory. Before a reader
opens the path a work unit names, ``DataRoots.check(path)`` resolves it the same
way and requires the result to lie inside one root, compared component by
component (``os.path.commonpath``, not a string prefix: ``/data2`` is not inside
``/data``). The reader then opens the *resolved* path.

A refused path raises ``PathRefused`` (a ``UnitReadError``) whose message names
the rule and nothing else: the same text whether the file exists or not, and
never where a symlink leads.

Decisions:

* **No roots, no files.** A worker started without ``--data-root`` refuses every
  path (``NO_ROOTS``); readers that open no files (``units``, an extension's API
  reader) work as before.
* **Relative paths are refused** (``REFUSED_RELATIVE``): a worker's working
  directory is no contract between coordinator and worker, and resolving
  against "the first root" would depend on the order of ``--data-root`` flags.
* **``run_local`` does not check** (``ANY_PATH``) unless its caller passes roots:
  it runs in the caller's own process, with the caller's permissions, on units
  the caller's own providers discovered.
* **Check, then open.** The two are separate steps: someone who can create
  symlinks or hard links *inside* a root can race a check or link a file from
  elsewhere into it. Roots must be directories the worker's clients cannot write.

Extension readers use the same check: ``ReaderContext.open_path(path)`` (or
``ctx.roots.check(path)``) returns the path to open, or raises ``PathRefused``.

**Object storage.** A root may be a URI (``--data-root s3://bucket/prefix``): a unit's
URI passes when it names the same store and bucket and its key lies under the root's,
compared by ``/``-separated components (``s3://b/data2/x`` is not under
``s3://b/data``). URIs with ``.`` or ``..`` segments, credentials or options are
refused before any check (``storage.parse_location``); a ``file://`` URI is a
local path and meets the directory roots. A URI never meets a directory root, nor
a path a URI root.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from flight.errors import UnitReadError
from flight.sources.storage import Location, parse_location

__all__ = ["ANY_PATH", "NO_ROOTS", "REFUSED", "REFUSED_RELATIVE", "DataRoots", "PathRefused", "set_worker_roots", "worker_roots"]

REFUSED = "path refused: work units may only name files under the worker's --data-root directories (rule: data roots)"
"""The message of every refused path (``PathRefused``), whatever the path and whether or not it exists."""
REFUSED_RELATIVE = "path refused: work units must name absolute paths (rule: data roots)"
"""The message for a relative path, which a worker never resolves."""


@dataclass(frozen=True)
class DataRoots:
    """The resolved directories a worker may read under; immutable.

    Build one with ``DataRoots.of(dirs)``; ``NO_ROOTS`` refuses everything, ``ANY_PATH``
    checks nothing (for ``run_local``).
    """

    paths: tuple[str, ...] = ()
    """Real paths (``os.path.realpath``) of existing directories."""
    locations: tuple[Location, ...] = ()
    """Prefixes in object stores (``--data-root s3://bucket/prefix``)."""
    unrestricted: bool = False
    """Check nothing: every path is returned as given."""

    @classmethod
    def of(cls, dirs: Iterable[str | os.PathLike[str]]) -> DataRoots:
        """Roots from directory names (resolved now) and store prefixes (``s3://bucket/prefix``);
        ``ValueError`` names one that is not a directory."""
        paths: list[str] = []
        locations: list[Location] = []
        for d in dirs:
            name = os.fspath(d)
            try:
                parsed = parse_location(name) if name else name
            except UnitReadError as exc:
                raise ValueError(f"data root {name!r}: {exc}") from None
            if isinstance(parsed, Location):
                if parsed not in locations:
                    locations.append(parsed)
                continue
            name = parsed
            real = os.path.realpath(name) if name else ""
            if not real or not os.path.isdir(real):
                raise ValueError(f"data root {name!r} is not an existing directory")
            if real not in paths:
                paths.append(real)
        return cls(tuple(paths), locations=tuple(locations))

    def check(self, path: str | os.PathLike[str]) -> str:
        """The path a reader should open for ``path``, or ``PathRefused``.

        ``path`` is resolved with ``os.path.realpath`` (symlinks and ``..``) and must lie inside
        one root; the resolved path is returned. The refusal never depends on whether the file exists.
        """
        located = self.locate(path)
        return str(located) if isinstance(located, Location) else located

    def locate(self, path: str | os.PathLike[str]) -> str | Location:
        """``check``, with a remote file as its ``Location``: a local real path, or a URI under a root.

        ``UnitReadError`` for a URI no worker opens (``storage.parse_location``), ``PathRefused`` otherwise.
        """
        name = os.fspath(path)
        if isinstance(name, str) and "://" in name:
            parsed = parse_location(name)
            if isinstance(parsed, Location):
                if self.unrestricted or any(parsed.within(root) for root in self.locations):
                    return parsed
                _refuse(REFUSED)
            path = parsed
        if self.unrestricted:
            return os.fspath(path)
        try:
            name = os.fspath(path)
            if not isinstance(name, str) or not os.path.isabs(name):
                _refuse(REFUSED_RELATIVE)
            real = os.path.realpath(name)
            for root in self.paths:
                if os.path.commonpath([root, real]) == root:
                    return real
        except (TypeError, ValueError):  # a NUL byte, bytes, ...: refused like any other path
            pass
        _refuse(REFUSED)

    def __bool__(self) -> bool:
        """Whether any path can pass."""
        return self.unrestricted or bool(self.paths) or bool(self.locations)


class PathRefused(UnitReadError):
    """A unit named a path outside the worker's data roots (or a relative one).

    The message names the rule only (``confine.REFUSED``): never whether the file exists, nor
    where the path resolves to. The worker reports it as a permission error.
    """


def _refuse(message: str) -> NoReturn:
    raise PathRefused(message)


NO_ROOTS = DataRoots()
"""No roots: every path is refused (a worker started without ``--data-root``)."""
ANY_PATH = DataRoots(unrestricted=True)
"""No check at all: ``run_local``, which reads with its caller's own permissions."""

_worker_roots: DataRoots = NO_ROOTS


def set_worker_roots(roots: DataRoots) -> None:
    """This process's roots, for tasks compiled without explicit ones (``flight-worker`` sets them at start)."""
    global _worker_roots
    _worker_roots = roots


def worker_roots() -> DataRoots:
    """This process's roots: what ``set_worker_roots`` set, ``NO_ROOTS`` before."""
    return _worker_roots
