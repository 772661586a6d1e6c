"""``pcie-tui report REC --plot FILE``: the session timeline as an SVG, PNG or PDF figure.

Per GPU: PCIe RX/TX (and NVLink where present) against the link's ceiling, DRAM and SM use,
engine phases as background bands, what bound each tick (attribution) as a thin strip, and first-token
marks where the recording knows them. matplotlib (Agg, no display) is imported only by
:func:`render_plot`, so a report without ``--plot`` never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pcie_tui.analyze.columns import tick_phase
from pcie_tui.analyze.engine import hist_delta
from pcie_tui.analyze.phases import PHASES
from pcie_tui.analyze.series import series_array
from pcie_tui.analyze.session import SessionAnalyzer
from pcie_tui.core.ceiling import pinned_ceiling
from pcie_tui.core.errors import UserError
from pcie_tui.core.model import EngineSample, GpuInfo
from pcie_tui.core.units import rate, seconds
from pcie_tui.engines import registry
from pcie_tui.engines.stats import unique_requests
from pcie_tui.plot.strip import STRIP, STRIP_COLOURS, attribution_strip, strip_colour, verdict_strip  # noqa: F401
from pcie_tui.recording.reader import Recording

FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf"}

PHASE_COLOURS = {
    "loading": "#aec7e8",
    "queue": "#dbdb8d",
    "housekeeping": "#c49c94",
    "prefill": "#ffbb78",
    "decode": "#98df8a",
    "mixed": "#f7b6d2",
    "idle": "#e5e5e5",
    "down": "#b0b0b0",
}
_EXTRA_PHASE_COLOURS = ("#c5b0d5", "#c49c94", "#dbdb8d", "#9edae5", "#ff9896", "#fdd0a2", "#c7e9c0", "#bcbddc")


def check_plot_path(path: str) -> tuple[Path, str]:
    """The plot's path and format, or a UserError; called before any analysis."""
    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise UserError(f"--plot {path}: unknown extension {p.suffix or '(none)'!r}; use .svg, .png or .pdf")
    if p.is_dir():
        raise UserError(f"--plot {path} is a directory; give a file name such as session.svg")
    folder = p.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UserError(f"--plot {path}: {folder} {what}")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"--plot {path}: no permission to write there")
    return p, fmt


def _floats(values: Sequence[Any]) -> np.ndarray:
    """None (or anything not a number) -> NaN, drawn as a gap."""
    return np.array([v if isinstance(v, int | float) and not isinstance(v, bool) else np.nan for v in values], float)


def gpu_tracks(rows: Sequence[dict[str, Any]], index: int, info: GpuInfo | None) -> dict[str, np.ndarray]:
    """Unix time and PCIe/NVLink rates (B/s) of each tick that has GPU ``index`` (its ``ceiling``
    column is NaN here: :func:`render_plot` fills it with the analysis' own ceiling per tick)."""
    cols: dict[str, list[Any]] = {k: [] for k in ("t", "rx", "tx", "nv_rx", "nv_tx", "ceiling")}
    for d in rows:
        for g in d.get("gpus") or ():
            if g.get("index") != index:
                continue
            cols["t"].append(d["t"])
            cols["rx"].append(g.get("pcie_rx_Bps"))
            cols["tx"].append(g.get("pcie_tx_Bps"))
            cols["nv_rx"].append(g.get("nvlink_rx_Bps"))
            cols["nv_tx"].append(g.get("nvlink_tx_Bps"))
            cols["ceiling"].append(None)  # the analysis' own, per tick: render_plot puts it in
            break
    return {k: _floats(v) for k, v in cols.items()}


def ceiling_label(info: GpuInfo | None, observed_Bps: float | None = None) -> tuple[float | None, str]:
    """The recording's PCIe ceiling (:mod:`pcie_tui.core.ceiling`) and its label, e.g.
    ``PCIe ceiling 56.7 GB/s per direction (default: 0.90 x theoretical Gen5 x16)``."""
    c = pinned_ceiling(info, observed_Bps=observed_Bps)
    if c.Bps is None:
        return None, "PCIe ceiling unknown (no link gen/width)"
    return c.Bps, f"PCIe ceiling {rate(c.Bps)} per direction ({c.detail})"


def phase_runs(times: Sequence[float], phases: Sequence[str | None]) -> list[tuple[float, float, str]]:
    """(start, end, phase) runs; a run lasts until the next tick's start (the last one a median tick)."""
    if not times:
        return []
    t = list(times)
    dt = float(np.median(np.diff(t))) if len(t) > 1 else 0.1
    out: list[tuple[float, float, str]] = []
    i = 0
    while i < len(t):
        j = i
        while j + 1 < len(t) and phases[j + 1] == phases[i]:
            j += 1
        end = t[j + 1] if j + 1 < len(t) else t[j] + dt
        if phases[i] is not None:
            out.append((t[i], end, str(phases[i])))
        i = j + 1
    return out


def first_token_marks(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """First-token marks as far as the recording knows them, and what they mean.

    An engine that times each request in its log (``extra["requests"]``): each finished request,
    first token at (time the log line was read - eval time), or at arrival + the client's TTFT where
    the log showed the arrival (llama-server: ``t_arrive``, ``client_ttft_s``); the bar before it spans
    the wait and the prompt eval (the prompt eval alone without an arrival). An engine with histograms: only their deltas, n first tokens seen by a scrape since the
    previous one, with their mean TTFT.
    """
    engines = [EngineSample.from_json(e) for d in rows if isinstance(e := d.get("engine"), dict)]
    marks: list[dict[str, Any]] = []
    for r in unique_requests(engines):
        t, pms, gms = r.get("t"), r.get("prompt_ms"), r.get("predicted_ms") or 0.0
        if not isinstance(t, int | float) or not isinstance(pms, int | float):
            continue
        arrive, ttft = r.get("t_arrive"), r.get("client_ttft_s")
        if isinstance(arrive, int | float) and isinstance(ttft, int | float):
            marks.append({"t": arrive + ttft, "start": arrive, "text": seconds(ttft), "parts": ttft_parts(r)})
            continue
        first = t - float(gms) / 1e3
        marks.append({"t": first, "start": first - pms / 1e3, "text": seconds(pms / 1e3)})
    if marks:
        split = any(m.get("parts") for m in marks)
        bar = "bar = its wait, coloured by part" if split else "bar = wait + prompt eval"
        return marks, f"first token, with its TTFT\n({registry.display(engines[0].kind)} log; {bar})"
    prev: dict[str, Any] | None = None
    for d in rows:
        e = d.get("engine")
        h = e.get("hist") if isinstance(e, dict) else None
        cur = h.get("ttft_s") if isinstance(h, dict) else None
        if not isinstance(cur, dict):
            continue
        delta = hist_delta(prev, cur) if prev is not None else None
        prev = cur
        n = (delta or {}).get("count") or 0
        if n > 0 and delta is not None:
            marks.append({"t": float(d["t"]), "start": None, "text": f"{n:g} x {seconds(delta['sum'] / n)}"})
    return marks, "first tokens since the previous scrape\n(vLLM histogram: count x mean TTFT)"


# A client's wait before its first token, part by part (llama-server's clock: docs/engines.md).
TTFT_PARTS = (
    ("queue_s", "slot wait", PHASE_COLOURS["queue"]),
    ("slot_setup_s", "slot setup (the engine's own work)", PHASE_COLOURS["housekeeping"]),
    ("batch_wait_s", "batch wait", "#9e9e9e"),
    ("prompt_ms", "prefill (prompt eval)", PHASE_COLOURS["prefill"]),
)


def ttft_parts(r: dict[str, Any]) -> list[tuple[float, float, str]]:
    """A request's wait as (start, end, part) from its arrival, part after part, where the log timed each
    (an empty list where any part is missing: the bar is then drawn whole)."""
    t = r.get("t_arrive")
    out: list[tuple[float, float, str]] = []
    for key, name, _ in TTFT_PARTS:
        v = r.get(key)
        if not isinstance(t, int | float) or not isinstance(v, int | float):
            return []
        d = max(float(v) / (1e3 if key == "prompt_ms" else 1.0), 0.0)
        if d > 0:
            out.append((t, t + d, name))
        t += d
    return out


# ---- drawing ------------------------------------------------------------------


def _line(ax: Any, x: np.ndarray, y: np.ndarray, **kw: Any) -> None:
    """A line broken at NaN; readings with no neighbour get a dot so they still show."""
    (ln,) = ax.plot(x, y, lw=1.2, **kw)
    ok = ~np.isnan(y)
    lone = ok & ~np.r_[False, ok[:-1]] & ~np.r_[ok[1:], False]
    if lone.any():
        ax.plot(x[lone], y[lone], ls="none", marker=".", ms=3, color=ln.get_color())


def _bands(ax: Any, runs: list[tuple[float, float, str]], t0: float, colours: dict[str, str]) -> None:
    for a, b, p in runs:
        ax.axvspan(a - t0, b - t0, color=colours[p], alpha=0.45, lw=0, zorder=0)


def _marks(ax: Any, marks: list[dict[str, Any]], t0: float, top: float, span_s: float) -> None:
    """First-token triangles near the top of a rate axis; each value written where it has room."""
    y = top * 0.88
    char_s = span_s * 0.068 / 8.5  # one 8 pt character in seconds of the ~8.5 in wide axis
    free = [-np.inf, -np.inf]  # where the next label may start, above and below the triangles
    for m in marks:
        x = m["t"] - t0
        if m.get("parts"):
            colour = {name: c for _, name, c in TTFT_PARTS}
            for a, b, name in m["parts"]:
                ax.plot([a - t0, b - t0], [y, y], color=colour[name], lw=4, solid_capstyle="butt")
        elif m["start"] is not None:
            ax.plot([m["start"] - t0, x], [y, y], color="#333333", lw=1.5, solid_capstyle="butt")
        ax.plot([x], [y], ls="none", marker="v", ms=6, color="#333333")
        left = x - 0.5 * char_s * len(m["text"])
        row = next((r for r in (0, 1) if left >= free[r]), None)
        if row is not None:
            free[row] = x + 0.5 * char_s * len(m["text"]) + char_s
            ax.annotate(m["text"], (x, y), xytext=(0, 5 if row == 0 else -7), textcoords="offset points",
                        ha="center", va="bottom" if row == 0 else "top", fontsize=8)  # fmt: skip


def _part_legend(ax: Any, marks: list[dict[str, Any]]) -> None:
    """Legend entries for the parts of the wait the bars show."""
    shown = {name for m in marks for _, _, name in m.get("parts") or ()}
    for _, name, colour in TTFT_PARTS:
        if name in shown:
            ax.plot([], [], color=colour, lw=4, label=name)


def _legend_right(ax: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False, borderaxespad=0.0)


def _rate_axis(ax: Any, t: np.ndarray, pairs: list[tuple[str, np.ndarray, str]], ceiling: dict[str, Any]) -> float:
    """Rates in GB/s against a ceiling; returns the top of the axis (GB/s)."""
    peak = max([float(np.nanmax(y)) / 1e9 for _, y, _ in pairs if np.any(~np.isnan(y))] or [0.0])
    value = ceiling["value"]
    top = max(peak, (value or 0.0) / 1e9, 1e-3) * 1.4
    for label, y, colour in pairs:
        _line(ax, t, y / 1e9, label=label, color=colour)
    per_tick = ceiling.get("per_tick")
    if value is not None:
        if per_tick is not None and np.any(~np.isnan(per_tick)) and np.nanmax(np.abs(per_tick - value)) > 1e6:
            ax.step(
                t,
                per_tick / 1e9,
                where="post",
                color="#222222",
                ls="--",
                lw=1,
                label="ceiling per tick (retrained or observed)",
            )
        else:
            ax.axhline(value / 1e9, color="#222222", ls="--", lw=1, label="ceiling")
        ax.annotate(ceiling["text"], (0.005, value / 1e9), xycoords=("axes fraction", "data"), xytext=(0, 3),
                    textcoords="offset points", fontsize=8, color="#222222")  # fmt: skip
    else:
        ax.text(0.005, 0.95, ceiling["text"], transform=ax.transAxes, fontsize=8, va="top")
    ax.set_ylim(0, top)
    ax.set_ylabel(ceiling["unit"])
    return top


def _pageable_line(ax: Any, info: GpuInfo | None) -> None:
    """The pageable-copy ceiling the attribution compares host<->GPU traffic with (dotted)."""
    from pcie_tui.analyze.attribution import ceilings

    c = ceilings(info)
    if c.pageable_Bps:
        src = c.pageable.source
        ax.axhline(c.pageable_Bps / 1e9, color="#e67e22", ls=":", lw=1,
                   label=f"pageable-copy ceiling {rate(c.pageable_Bps)} ({src})")  # fmt: skip


def _gpu_title(index: int, info: GpuInfo | None) -> str:
    if info is None:
        return f"GPU {index}"
    link = f"PCIe Gen{info.link.gen} x{info.link.width}" if info.link.gen else "PCIe link unknown"
    nv = f", NVLink x{info.nvlink_count}" if info.nvlink_count else ""
    return f"GPU {index} {info.name} ({link}{nv})"


def _title(rec: Recording, an: SessionAnalyzer, duration_s: float) -> str:
    infos = [g for g in rec.header.gpus if g.index in an.series] or list(rec.header.gpus)
    names = sorted({g.name for g in infos if g.name})
    links = sorted({f"PCIe Gen{g.link.gen} x{g.link.width}" for g in infos if g.link.gen})
    gpus = (f"{len(infos)} x " if len(infos) > 1 else "") + (" / ".join(names) or "GPU")
    what = [f"{gpus}, {' / '.join(links) or 'link unknown'}"] if an.series else ["no GPU readings"]
    kind = (rec.header.engine or {}).get("kind")
    if kind:
        what.append(registry.display(kind))
    return f"{rec.path.name}: {', '.join(what)}; {duration_s:.1f} s"


def render_plot(rec: Recording, an: SessionAnalyzer, path: Path, fmt: str) -> None:
    """Draw the timeline of ``rec`` (analysed as ``an``) into ``path`` as ``fmt`` (svg/png/pdf)."""
    import matplotlib

    matplotlib.use("Agg")  # no display; the Figure below is not registered with pyplot either
    from matplotlib.figure import Figure
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    rows = rec.rows if rec.rows is not None else [s.to_json() for s in rec.samples]
    t0 = an.t0 if an.t0 is not None else float(rows[0]["t"])
    t_end = an.t_last if an.t_last is not None else float(rows[-1]["t"])
    marks, marks_label = first_token_marks(rows)
    colours = _phase_colours(an, rows)
    phase_names = list(colours)
    gpus = sorted(an.series)
    tracks = _tracks(rec, an, rows, gpus)
    kinds = _axis_kinds(gpus, tracks)
    heights = {"pcie": 2.6, "nvlink": 1.8, "use": 1.8, "strip": 0.3, "engine": 2.2}
    ratios = [heights[k] for _, k in kinds]

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "pcie-tui", "font.size": 9}):
        # Title and phase legend above the axes, the strip's legend below: room kept in inches.
        top_in, bottom_in = 0.4 + (0.8 if phase_names else 0.0), 0.45 if gpus else 0.05
        fig_h = sum(ratios) + 0.7 + top_in + bottom_in
        layout = ConstrainedLayoutEngine(rect=(0, bottom_in / fig_h, 1, 1 - top_in / fig_h))
        fig = Figure(figsize=(12, fig_h), layout=layout)
        axes = np.atleast_1d(fig.subplots(len(kinds), 1, sharex=True, height_ratios=ratios))
        strip_labels: list[str] = []
        for ax, (i, kind) in zip(axes, kinds, strict=True):
            if kind == "strip":
                assert i is not None
                t, labels, cols = STRIP(an, i)
                _strip(ax, t, labels, cols, t0)
                strip_labels = list(dict.fromkeys([*strip_labels, *labels]))
                continue
            if kind == "engine":
                _engine_axis(ax, rows, t0)
            ser = an.series[i] if i is not None else None
            runs = phase_runs(ser.t, ser.phase) if ser is not None else phase_runs([d["t"] for d in rows], [tick_phase(d) for d in rows])  # fmt: skip
            _bands(ax, runs, t0, colours)
            ax.grid(axis="y", color="#cccccc", lw=0.5)
            if kind in ("pcie", "nvlink") and i is not None:
                observed = an.trackers[i].observed_Bps if i in an.trackers else None
                top = _link_axis(ax, kind, i, rec.header.gpu(i), tracks[i], t0, observed)
                if kind == "pcie" and marks:
                    _marks(ax, marks, t0, top, t_end - t0)
                    ax.plot([], [], ls="none", marker="v", color="#333333", label=marks_label)
                    _part_legend(ax, marks)
            elif kind == "use" and ser is not None:
                _use_axis(ax, ser, t0)
            elif kind == "engine" and marks:
                _marks(ax, marks, t0, ax.get_ylim()[1], t_end - t0)
                ax.plot([], [], ls="none", marker="v", color="#333333", label=marks_label)
            if ax.get_legend_handles_labels()[0]:
                _legend_right(ax)
        axes[-1].set_xlim(0, max(t_end - t0, 1e-3))
        axes[-1].set_xlabel("time since session start (s)")
        fig.text(0.5, 1 - 0.08 / fig_h, _title(rec, an, t_end - t0), ha="center", va="top", fontsize=11)
        _figure_legends(fig, colours, strip_labels, fig_h, bottom_in)
        _save(fig, path, fmt)


def _tracks(
    rec: Recording, an: SessionAnalyzer, rows: Sequence[dict[str, Any]], gpus: list[int]
) -> dict[int, dict[str, np.ndarray]]:
    """Per GPU its rates (:func:`gpu_tracks`) and the one PCIe ceiling of each tick, as the analysis took it."""
    tracks = {i: gpu_tracks(rows, i, rec.header.gpu(i)) for i in gpus}
    for i in gpus:
        ceiling = series_array(an.series[i], "pcie_ceiling")
        if ceiling.size == tracks[i]["t"].size:
            tracks[i]["ceiling"] = ceiling
    return tracks


def _phase_colours(an: SessionAnalyzer, rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The band colour of each phase the one analysis saw (the engine's in an engine session, else
    the labels; with no GPU readings, the ticks' own): known phases first in their order, then the
    others as they first appear."""
    phase_names = list(dict.fromkeys(p for i in an.series for p in an.series[i].phase if p is not None))
    if not an.series:
        phase_names = list(dict.fromkeys(p for d in rows if (p := tick_phase(d)) is not None))
    phase_names = [p for p in PHASES if p in phase_names] + [p for p in phase_names if p not in PHASES]
    extra = iter(_EXTRA_PHASE_COLOURS * 4)
    return {p: PHASE_COLOURS.get(p) or next(extra, "#dddddd") for p in phase_names}


def _axis_kinds(gpus: list[int], tracks: dict[int, dict[str, np.ndarray]]) -> list[tuple[int | None, str]]:
    """The axes top to bottom: per GPU its PCIe rates, NVLink rates where it has any, use and the
    bound strip; without GPUs, the engine's requests."""
    kinds: list[tuple[int | None, str]] = []
    for g in gpus:
        has_nv = bool(np.any(~np.isnan(tracks[g]["nv_rx"])) or np.any(~np.isnan(tracks[g]["nv_tx"])))
        kinds += [(g, "pcie")] + ([(g, "nvlink")] if has_nv else []) + [(g, "use"), (g, "strip")]
    return kinds or [(None, "engine")]


def _link_axis(
    ax: Any, kind: str, i: int, info: GpuInfo | None, tr: dict[str, np.ndarray], t0: float, observed: float | None
) -> float:
    """GPU ``i``'s PCIe (with its title and the pageable-copy ceiling) or NVLink rates against their
    ceiling; returns the top of the axis (GB/s)."""
    x = tr["t"] - t0
    if kind == "pcie":
        value, text = ceiling_label(info, observed)
        ceiling = {"value": value, "text": text, "per_tick": tr["ceiling"], "unit": "PCIe (GB/s)"}
        pairs = [("PCIe RX (into GPU)", tr["rx"], "#1f77b4"), ("PCIe TX (out of GPU)", tr["tx"], "#ff7f0e")]
        ax.set_title(_gpu_title(i, info), loc="left", fontsize=10, fontweight="bold")
    else:
        nc = info.nvlink_capacity_Bps if info is not None else None
        text = f"NVLink ceiling {rate(nc)} per direction (theoretical)" if nc else "NVLink ceiling unknown"  # fmt: skip
        ceiling = {"value": nc, "text": text, "unit": "NVLink (GB/s)"}
        pairs = [("NVLink RX", tr["nv_rx"], "#17becf"), ("NVLink TX", tr["nv_tx"], "#bcbd22")]
    top = _rate_axis(ax, x, pairs, ceiling)
    if kind == "pcie":
        _pageable_line(ax, info)
    return top


def _use_axis(ax: Any, ser: Any, t0: float) -> None:
    """A GPU's DRAM (bandwidth, or NVML's duty cycle as a proxy) and SM use in percent."""
    x = np.asarray(ser.t) - t0
    dram = "DRAM busy (proxy)\nNVML duty cycle, not bandwidth" if ser.memory_proxy else "DRAM bandwidth (GPM, of peak)"
    _line(ax, x, _floats(ser.memory) * 100, label=dram, color="#2ca02c")
    _line(ax, x, _floats(ser.compute) * 100, label="SM busy (of all SMs)", color="#8e44ad")
    ax.set_ylim(0, 105)
    ax.set_ylabel("use (%)")


def _figure_legends(fig: Any, colours: dict[str, str], strip_labels: list[str], fig_h: float, bottom_in: float) -> None:
    """The phase legend above the axes and the strip's legend, with its caption, below them."""
    from matplotlib.patches import Patch

    phase_names = list(colours)
    if phase_names:
        handles = [Patch(color=colours[p], alpha=0.6, label=p) for p in phase_names]
        fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.38 / fig_h), fontsize=8,
                   ncol=min(len(handles), 9), title="phase (engine phase, else the recording's label)",
                   title_fontsize=8, frameon=False, borderaxespad=0)  # fmt: skip
    if strip_labels:
        handles = [Patch(color=strip_colour(v), label=v) for v in strip_labels]
        fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.04 / fig_h), ncol=len(handles) + 1,
                   fontsize=8, frameon=False, borderaxespad=0, title=None)  # fmt: skip
        fig.text(0.5, (bottom_in - 0.02) / fig_h, "strip: what bound each tick (link-saturated, transfer-bound, host-bound, memory, compute, idle)", ha="center", va="top", fontsize=8)  # fmt: skip


def _strip(ax: Any, t: list[float], labels: list[str], cols: list[str], t0: float) -> None:
    """One coloured span per run of equal labels."""
    for a, b, _label in phase_runs(t, labels):
        i = t.index(a)
        ax.axvspan(a - t0, b - t0, color=cols[i], lw=0)
    ax.set_yticks([])
    ax.set_ylabel("bound", rotation=0, ha="right", va="center", fontsize=8)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _engine_axis(ax: Any, rows: Sequence[dict[str, Any]], t0: float) -> None:
    """A recording without GPUs: the engine's running and waiting requests."""
    x = np.array([float(d["t"]) - t0 for d in rows])
    engines: list[dict[str, Any]] = [e if isinstance(e := d.get("engine"), dict) else {} for d in rows]
    run, wait = (_floats([e.get(k) for e in engines]) for k in ("requests_running", "requests_waiting"))
    if np.all(np.isnan(run)) and np.all(np.isnan(wait)):
        ax.text(0.5, 0.5, "no GPU or engine readings in this recording", transform=ax.transAxes, ha="center")
    _line(ax, x, run, label="requests running", color="#1f77b4")
    _line(ax, x, wait, label="requests waiting", color="#ff7f0e")
    peak = np.nanmax(np.r_[run, wait, 0.0])
    ax.set_ylim(0, max(1.0, peak) * 1.3)
    ax.set_ylabel("requests")
    ax.set_title("no GPU in this recording: engine only", loc="left", fontsize=10, fontweight="bold")


def _save(fig: Any, path: Path, fmt: str) -> None:
    """Write next to the target and rename, so a failed write leaves no half file under its name."""
    tmp = path.with_name(f".{path.name}.tmp")
    meta = {"Date": None} if fmt == "svg" else {}
    try:
        fig.savefig(tmp, format=fmt, dpi=120, metadata=meta)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"--plot {path}: cannot write: {e.strerror or e}") from None
