"""The machine fingerprint a baseline stores, and the baseline files themselves.

A baseline is one plain JSON file per run (sorted keys, indented, so two of them
diff cleanly): ``baseline-<host>-<UTC time>.json``. ``pcie-tui doctor
--save-baseline`` writes one from its own readings (links under its generated
load), ``pcie-tui calibrate`` one beside its calibration file (links under the
calibration copies), ``bench/run.py`` one beside ``bench/results.md``.

Facts come from the code doctor already has: NVML through ``nvmlfacts``, the
bridge chain through ``topology``, and ``/proc`` for the host. The comparison
rules live in ``retest.py``. A fact that could not be read is None, never 0;
a doctor ``--json`` report converts to a baseline too (``from_report``), with
the host facts it lacks left None.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pcie_tui.core.errors import NoGpuError, UserError

FORMAT = "pcie-tui/baseline"
VERSION = 1

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


# ---- host ---------------------------------------------------------------------------


def host_facts(proc_root: str | Path = "/proc", driver: str | None = None) -> dict[str, Any]:
    """Hostname, CPU model, logical CPU count and VM flag (``cpuinfo``), memory (``meminfo`` MemTotal), driver."""
    proc = Path(proc_root)
    model, count, virtual = None, None, None
    with contextlib.suppress(OSError):
        lines = (proc / "cpuinfo").read_text().splitlines()
        count = sum(1 for ln in lines if re.match(r"processor\s*:", ln)) or None
        model = next((ln.split(":", 1)[1].strip() for ln in lines if re.match(r"model name\s*:", ln)), None)
        flags = next((ln.split(":", 1)[1].split() for ln in lines if re.match(r"flags\s*:", ln)), None)
        virtual = None if flags is None else "hypervisor" in flags  # x86: set inside a VM
    mem = None
    with contextlib.suppress(OSError, ValueError):
        m = re.search(r"^MemTotal:\s*(\d+)\s*kB", (proc / "meminfo").read_text(), re.M)
        mem = int(m.group(1)) * 1024 if m else None
    return {
        "hostname": socket.gethostname(),
        "cpu_model": model,
        "cpu_count": count,
        "memory_bytes": mem,
        "driver_version": driver,
        "virtual_machine": virtual,
    }


def driver_version(nvml: Any) -> str | None:
    """``nvmlSystemGetDriverVersion`` (NVML initialised), None when it cannot answer."""
    try:
        v = nvml.nvmlSystemGetDriverVersion()
    except Exception:  # NVMLError, or a pynvml / stand-in without the call
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


# ---- GPUs ---------------------------------------------------------------------------


def _val(v: Any) -> Any:
    """A doctor reading (value or ``{"error": ...}``) -> value or None."""
    return None if isinstance(v, dict) else v


def _keyed(d: dict[Any, Any] | None, i: int) -> Any:
    d = d or {}
    return d.get(i, d.get(str(i)))


def gpu_entry(g: dict[str, Any], chain: dict[str, Any] | None, load: dict[str, Any] | None) -> dict[str, Any]:
    """One GPU's facts from doctor's JSON pieces (``GpuFacts.to_json``, ``Chain.to_json``, ``LoadReadings.to_json``)."""
    i = int(g["index"])
    idle = g.get("link_idle") or {}
    under: dict[str, Any] | None = None
    load = load or {}
    reading = _keyed(load.get("links"), i)
    if reading and _keyed(load.get("loaded"), i) and load.get("how") in ("generated", "engine"):
        gen, width = _val(reading.get("cur_gen")), _val(reading.get("cur_width"))
        if gen is not None and width is not None:
            under = {"gen": gen, "width": width, "how": load["how"]}
    nvml_node = _val(g.get("numa_node_nvml"))
    nvml_node = nvml_node if isinstance(nvml_node, int) and nvml_node >= 0 else None
    chain = chain or {}
    sys_node = chain.get("numa_node")
    node = nvml_node if nvml_node is not None else sys_node
    narrow = chain.get("narrowest")
    return {
        "index": i,
        "uuid": g.get("uuid"),
        "name": g.get("name"),
        "pci_bus_id": g.get("pci_bus_id"),
        "link": {k: _val(idle.get(k)) for k in ("max_gen", "max_width", "gpu_max_gen")}
        | {"idle_gen": _val(idle.get("cur_gen")), "idle_width": _val(idle.get("cur_width"))},
        "under_load": under,
        "chain": {
            "found": bool(chain.get("found")),
            "attach": chain.get("attach"),
            "narrowest": None
            if not narrow
            else {
                "hop": f"{narrow.get('upper')} -> {narrow.get('lower')}",
                "max_gen": narrow.get("max_gen"),
                "max_width": narrow.get("max_width"),
            },
        },
        "numa_node": node,
        "numa_source": "NVML" if nvml_node is not None else ("sysfs" if node is not None else None),
    }


# ---- engine -------------------------------------------------------------------------


def layout_flags(kind: str | None, argv: list[str] | None) -> dict[str, Any]:
    """The whitelisted layout flags of an engine command line, by canonical name (last wins; -ot collects)."""
    from pcie_tui.engines import registry

    eng = registry.get(kind)
    spec = eng.layout_flags if eng is not None else {}
    repeatable = eng.layout_repeatable if eng is not None else frozenset()
    alias = {n: key for key, names in spec.items() for n in names}
    out: dict[str, Any] = {}
    args = list(argv or [])
    for j, a in enumerate(args):
        name, eq, val = a.partition("=")
        # --long_name is --long-name to llama.cpp's arg.cpp (and vLLM's parser); an engine whose parser
        # rejects it never started with it.
        key = alias.get(name) or (alias.get(name.replace("_", "-")) if name.startswith("--") else None)
        if key is None:
            continue
        value: Any = val if eq else None
        if value is None:
            nxt = args[j + 1] if j + 1 < len(args) else None
            value = nxt if nxt is not None and not re.match(r"-[A-Za-z-]", nxt) else True
        if key in repeatable:
            out.setdefault(key, []).append(value)
        else:
            out[key] = value
    return out


def model_facts(path: str | None) -> dict[str, Any] | None:
    """File name and size of the model (a GGUF file, or the weight files of a model directory)."""
    if not path:
        return None
    p = Path(path)
    size: int | None = None
    with contextlib.suppress(OSError):
        if p.is_file():
            size = p.stat().st_size
        elif p.is_dir():
            size = (
                sum(f.stat().st_size for f in p.iterdir() if f.name.endswith(_WEIGHT_SUFFIXES) and f.is_file()) or None
            )
    return {"name": p.name or path, "size_bytes": size}


def engine_facts(engine: dict[str, Any] | None) -> dict[str, Any] | None:
    """Kind, version, layout flags and model of an engine (a recording header's ``engine`` or a live attach)."""
    if not engine or not engine.get("kind"):
        return None
    layout = engine.get("layout") or {}
    kind = engine["kind"]
    return {
        "kind": kind,
        "version": engine.get("version"),
        "flags": layout_flags(kind, engine.get("cmdline")),
        "model": model_facts(layout.get("model") or engine.get("model")),
    }


def engine_from_pid(pid: int) -> dict[str, Any] | None:
    """The engine ``pid`` belongs to, or None when it is no engine's process."""
    from pcie_tui.engines.discover import candidate_for_pid

    try:
        c = candidate_for_pid(pid)
    except UserError:
        return None
    return engine_facts({"kind": c.kind, "version": c.version, "cmdline": list(c.cmdline), "layout": c.layout})


def engine_from_recording(path: str) -> dict[str, Any] | None:
    from pcie_tui.recording.demos import recording_path
    from pcie_tui.recording.reader import read_recording

    return engine_facts(read_recording(recording_path(path)[0]).header.engine)


# ---- whole fingerprints -------------------------------------------------------------


def from_report(
    report: dict[str, Any],
    host: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    source: str = "doctor",
) -> dict[str, Any]:
    """A baseline from a doctor report (``run_doctor`` or a saved ``doctor --json``)."""
    t = float(report.get("time") or time.time())
    h = dict(
        host
        or {
            "hostname": report.get("host"),
            "cpu_model": None,
            "cpu_count": None,
            "memory_bytes": None,
            "driver_version": None,
        }
    )
    if h.get("driver_version") is None:
        h["driver_version"] = report.get("driver_version")
    chains = report.get("chains") or {}
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": source,
        "created": datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "time": t,
        "tool_version": _tool_version(),
        "host": h,
        "gpus": [gpu_entry(g, _keyed(chains, int(g["index"])), report.get("load")) for g in report.get("gpus") or []],
        "gpu_error": report.get("gpu_error"),
        "engine": engine,
    }


def no_gpu(
    error: str, host: dict[str, Any], engine: dict[str, Any] | None = None, source: str = "doctor"
) -> dict[str, Any]:
    """A fingerprint of a machine where NVML or a GPU is missing: host facts and why."""
    return from_report({"time": time.time(), "gpus": [], "gpu_error": error}, host, engine, source)


def snapshot(
    nvml: Any = None,
    sysfs_root: str = "/sys",
    proc_root: str = "/proc",
    calibration: list[dict[str, Any]] | None = None,
    source: str = "calibrate",
) -> dict[str, Any]:
    """Read the machine now without generating load; ``calibration`` entries give each link's under-load state."""
    from pcie_tui.doctor.nvmlfacts import gather, open_nvml
    from pcie_tui.doctor.topology import read_chain

    try:
        nv = open_nvml(nvml)
    except NoGpuError as e:
        return no_gpu(str(e), host_facts(proc_root), source=source)
    try:
        gpus = gather(nv)
        report = {
            "time": time.time(),
            "gpus": [g.to_json() for g in gpus],
            "chains": {str(g.index): read_chain(sysfs_root, g.bdf).to_json() for g in gpus},
        }
        host = host_facts(proc_root, driver_version(nv))
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    fp = from_report(report, host, None, source)
    by_uuid = {c.get("uuid"): c for c in calibration or []}
    for g in fp["gpus"]:
        c = by_uuid.get(g["uuid"])
        if c and c.get("gen") is not None and c.get("width") is not None:
            g["under_load"] = {"gen": c["gen"], "width": c["width"], "how": "calibrate"}
    return fp


def _tool_version() -> str:
    from pcie_tui import __version__

    return __version__


# ---- files --------------------------------------------------------------------------


def default_dir() -> Path:
    """Where baselines go by default: beside the calibration (``$XDG_CONFIG_HOME/pcie-tui``)."""
    from pcie_tui.core.calibration import config_path

    return config_path().parent


def file_name(fp: dict[str, Any]) -> str:
    host = re.sub(r"[^A-Za-z0-9._-]+", "_", str(fp["host"].get("hostname") or "host")) or "host"
    stamp = datetime.fromtimestamp(fp["time"], timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"baseline-{host}-{stamp}.json"


def write(fp: dict[str, Any], directory: str | Path | None = None) -> Path:
    """Write ``fp`` as ``baseline-<host>-<UTC time>.json`` into ``directory`` (created if needed)."""
    d = Path(directory) if directory is not None else default_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        path = d / file_name(fp)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(fp, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as e:
        raise UserError(f"cannot write a baseline into {d}: {e.strerror or e}") from e
    return path


def newest(directory: Path) -> Path:
    files = sorted(directory.glob("baseline-*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    if not files:
        raise UserError(f"no baseline-*.json in {directory}")
    return files[-1]


def load(path: str | Path) -> dict[str, Any]:
    """A baseline file (or a directory: its newest baseline, or a doctor ``--json`` report); UserError if unusable."""
    p = Path(path)
    if p.is_dir():
        p = newest(p)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"baseline {path} does not exist") from None
    except OSError as e:
        raise UserError(f"cannot read baseline {path}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"baseline {path} is not JSON ({e})") from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt == "pcie-tui/doctor":
        data = from_report(data, source="doctor report")
    elif fmt != FORMAT:
        raise UserError(f"{path} is not a pcie-tui baseline (format {fmt!r}, want {FORMAT!r})")
    gpus, engine = data.get("gpus"), data.get("engine")
    if (
        not isinstance(gpus, list)
        or not all(isinstance(g, dict) for g in gpus)
        or not isinstance(data.get("host"), dict)
    ):
        raise UserError(f"baseline {path} lacks its gpus or host facts")
    if engine is not None and not isinstance(engine, dict):
        raise UserError(f"baseline {path}: engine is not an object")
    data["path"] = str(p)
    return data
