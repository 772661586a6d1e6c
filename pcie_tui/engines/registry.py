"""The engines pcie-tui knows, in the order discovery and URL probing try them.

Each built-in engine is a module (or package) under ``pcie_tui.engines`` exposing
``ENGINE``, an :class:`~pcie_tui.engines.base.Engine` instance. The generic code asks
this registry, never an engine by name::

    registry.get("vllm").display            # "vLLM"; None for a kind nobody registered
    registry.for_process(argv, name)         # (engine, "root" | "child") or None
    registry.engines()                       # every engine, in probe order

Tests (and plug-ins) may :func:`register` an engine at run time and
:func:`unregister` it again.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence

from pcie_tui.engines.base import Engine, Role

# Built-in engines, one module each, in probe order (a module path per line).
BUILTIN: tuple[str, ...] = (
    "pcie_tui.engines.vllm",
    # Written from documentation (tested = False). Ollama v0.30+ runs an upstream llama-server as its
    # runner child (an Ollama blob as its model, --offline --no-webui): Ollama is asked before
    # llama.cpp so that child is found as Ollama's runner, under ``ollama serve``.
    "pcie_tui.engines.ollama",
    "pcie_tui.engines.llamacpp",
    "pcie_tui.engines.sglang",
)

_lock = threading.Lock()
_engines: list[Engine] | None = None


def _load() -> list[Engine]:
    global _engines
    with _lock:
        if _engines is None:
            found: list[Engine] = []
            for mod in BUILTIN:
                eng = importlib.import_module(mod).ENGINE
                if not isinstance(eng, Engine):
                    raise TypeError(f"{mod}.ENGINE is not an Engine")
                found.append(eng)
            _engines = found
        return _engines


def engines() -> tuple[Engine, ...]:
    """Every registered engine, in probe order."""
    return tuple(_load())


def get(kind: str | None) -> Engine | None:
    """The engine recorded as ``kind``, or None (no kind, or one no registered engine has)."""
    if not kind:
        return None
    if _engines is None and (eng := _builtin_named(kind)) is not None:
        return eng
    return next((e for e in _load() if e.name == kind), None)


def _builtin_named(kind: str) -> Engine | None:
    """The built-in engine of module ``pcie_tui.engines.<kind>`` when its name is ``kind``, importing only
    that module (``report`` on a recording of one engine needs no other: each costs start-up time)."""
    mod = f"pcie_tui.engines.{kind}"
    if mod not in BUILTIN:
        return None
    eng = getattr(importlib.import_module(mod), "ENGINE", None)
    return eng if isinstance(eng, Engine) and eng.name == kind else None


def display(kind: str | None) -> str:
    """The engine's display name, or the kind itself for one nobody registered ("engine" for none)."""
    e = get(kind)
    return e.display if e is not None else (str(kind) if kind else "engine")


def names() -> tuple[str, ...]:
    """The recorded kinds of every engine, in probe order."""
    return tuple(e.name for e in _load())


def displays(joiner: str = " or ") -> str:
    """Every engine's display name, tested ones first, e.g. "vLLM, llama-server, Ollama or SGLang"."""
    shown = [e.display for e in sorted(_load(), key=lambda e: not e.tested)]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + joiner + shown[-1]


def for_process(argv: Sequence[str], proc_name: str = "") -> tuple[Engine, Role] | None:
    """The engine a process belongs to and its role there, by command line and process name."""
    for e in _load():
        role = e.classify(argv, proc_name)
        if role is not None:
            return e, role
    return None


def probe_paths() -> tuple[str, ...]:
    """Every engine's probe paths, each once, in registry order (what attach by URL GETs)."""
    out: list[str] = []
    for e in _load():
        out.extend(p for p in e.probe_paths if p not in out)
    return tuple(out)


def for_probe(path: str, status: int, body: bytes) -> Engine | None:
    """The first engine (registry order) that recognises this answer to ``GET path``."""
    return next((e for e in _load() if path in e.probe_paths and e.recognise(path, status, body)), None)


def register(engine: Engine, *, first: bool = False) -> None:
    """Add an engine (before the others with ``first``: probed first). Replaces one of the same name."""
    if not isinstance(engine, Engine):
        raise TypeError("register() takes an Engine instance")
    cur = _load()
    with _lock:
        rest = [e for e in cur if e.name != engine.name]
        cur[:] = [engine, *rest] if first else [*rest, engine]


def unregister(name: str) -> None:
    """Remove the engine registered as ``name`` (no error when there is none)."""
    cur = _load()
    with _lock:
        cur[:] = [e for e in cur if e.name != name]
