"""Read each GPU's link state under load.

Idle GPUs train their links down (P8 -> Gen1), so a link is judged only while
traffic flows: doctor queues pinned copies on every GPU (PyTorch or
cuda-python) for a few seconds, or, when neither is installed, reads while the
GPU's own processes (an attached engine) run. The result says which it was.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pcie_tui.doctor.nvmlfacts import GpuFacts, LinkRead, read_link
from pcie_tui.doctor.sysfs_pci import device_path, parse_link_speed


@dataclass
class LoadReadings:
    how: str  # "generated" | "engine" | "idle"
    detail: str
    seconds: float
    links: dict[int, LinkRead] = field(default_factory=dict)  # best reading per GPU
    loaded: dict[int, bool] = field(default_factory=dict)  # reading counts as under load
    sysfs_links: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    generator_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "how": self.how,
            "detail": self.detail,
            "seconds": self.seconds,
            "links": {i: r.to_json() for i, r in self.links.items()},
            "loaded": self.loaded,
            "sysfs_links": {i: {"gen": g, "width": w} for i, (g, w) in self.sysfs_links.items()},
            "generator_error": self.generator_error,
        }


def _score(r: LinkRead) -> tuple[int, int]:
    return (r.cur_gen.value or 0 if r.cur_gen.ok else 0, r.cur_width.value or 0 if r.cur_width.ok else 0)


def _sysfs_link(sysfs_root: str, bdf: str) -> tuple[int | None, int | None]:
    p = device_path(sysfs_root, bdf)
    if p is None:
        return None, None
    try:
        gen = parse_link_speed((p / "current_link_speed").read_text())
        width = int((p / "current_link_width").read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None, None
    return gen, width


def _util(nvml: Any, g: GpuFacts) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetUtilizationRates(g.handle).gpu)
    except Exception:  # NVMLError, or a stand-in without the call
        return None


def sample_links(
    nvml: Any,
    gpus: list[GpuFacts],
    sysfs_root: str,
    seconds: float,
    period_s: float = 0.2,
    util_max: dict[int, int] | None = None,
) -> tuple[dict[int, LinkRead], dict[int, tuple[int | None, int | None]]]:
    """Best (highest gen, then width) NVML and sysfs reading per GPU over ``seconds``.

    With ``util_max``, also keeps each GPU's highest NVML utilisation seen.
    """
    best: dict[int, LinkRead] = {}
    best_sys: dict[int, tuple[int | None, int | None]] = {}
    t_end = time.monotonic() + max(seconds, 0.0)
    while True:
        for g in gpus:
            if util_max is not None:
                u = _util(nvml, g)
                if u is not None:
                    util_max[g.index] = max(u, util_max.get(g.index, 0))
            r = read_link(nvml, g.handle)
            if g.index not in best or _score(r) > _score(best[g.index]):
                best[g.index] = r
            s = _sysfs_link(sysfs_root, g.bdf)
            old = best_sys.get(g.index)
            if old is None or (s[0] or 0, s[1] or 0) > (old[0] or 0, old[1] or 0):
                best_sys[g.index] = s
        if time.monotonic() >= t_end:
            return best, best_sys
        time.sleep(period_s)


def read_under_load(
    nvml: Any,
    gpus: list[GpuFacts],
    sysfs_root: str,
    seconds: float,
    backend_factory: Callable[[], Any] | None = None,
) -> LoadReadings:
    """Generate load when a copy backend exists, else read while the GPUs' own work runs."""
    backend = None
    gen_error = None
    if seconds > 0 and backend_factory is not None:
        try:
            backend = backend_factory()
        except Exception as e:  # UserError naming the extra, or a CUDA init failure
            gen_error = str(e)
    if backend is not None:
        stop = threading.Event()
        errors: list[str] = []

        def run() -> None:
            try:
                backend.background_load(list(range(backend.device_count())), stop)
            except Exception as e:  # reported, not raised: the readings say whether load happened
                errors.append(f"{type(e).__name__}: {e}")

        th = threading.Thread(target=run, name="doctor-load", daemon=True)
        th.start()
        time.sleep(min(0.5, seconds / 3))  # let the links train up
        links, sys_links = sample_links(nvml, gpus, sysfs_root, seconds * 2 / 3)
        stop.set()
        th.join(timeout=10)
        if errors:
            gen_error = errors[0]
        else:
            return LoadReadings(
                "generated",
                f"{backend.name} pinned host<->device copies on every GPU for {seconds:g} s",
                seconds,
                links,
                {g.index: True for g in gpus},
                sys_links,
            )
    util_max: dict[int, int] = {}
    links, sys_links = sample_links(nvml, gpus, sysfs_root, max(seconds, 0.0), util_max=util_max)
    # A process that merely holds the GPU (an idle engine) leaves the link trained down:
    # only a GPU seen computing counts as loaded.
    busy = {g.index: util_max.get(g.index, 0) > 0 for g in gpus}
    if any(busy.values()):
        how, detail = "engine", "no load generated; read while the GPUs' own work ran (GPUs seen busy count as loaded)"
    else:
        how, detail = "idle", "no load generated and nothing running: idle links may have trained down"
    if gen_error:
        detail += f" [load generator: {gen_error}]"
    return LoadReadings(how, detail, seconds, links, busy, sys_links, gen_error)
