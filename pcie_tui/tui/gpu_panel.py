"""One GPU's panel: verdict badge, link TX/RX against the ceiling, NVLink, DRAM, SM, memory, power."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from pcie_tui.core import clocks, metrics
from pcie_tui.core.model import GpuInfo, GpuSample
from pcie_tui.tui import fmt
from pcie_tui.tui.state import Frame, GpuView
from pcie_tui.tui.widgets import BUS_WORDS, EVENT_DIRECTION_WORDS, HistoryLegend, MetricRow, set_border_title, set_text

# What fits on the badge row of a GPU panel at 80 columns (border and padding off).
NARROW_BADGE_CHARS = 76


# Where the one link ceiling came from (pcie_tui.core.ceiling), in a panel's few cells.
CEILING_WORDS = {"calibrated": "calib.", "default": "default", "observed": "observed", "unknown": "unknown"}


def badge(g: GpuView, phase: str | None, wide: bool = False) -> tuple[str, str]:
    """(text, css class) of the verdict badge."""
    u = g.util
    if g.verdict == "link":
        ev = next((e for e in g.open_events if e.resource == "link"), None)
        bus = BUS_WORDS.get((ev.bus if ev else None) or (u.link_bus if u else None) or "", "link")
        # The event's direction(s); before it is recorded, the busiest direction now.
        direction = (ev.direction if ev else None) or (u.link_dir if u else None)
        dirs = EVENT_DIRECTION_WORDS.get(direction or "", "")
        now_util = u.link if u else None
        parts = ["LINK SATURATED", f"{bus} {dirs}".strip()]
        if ev is not None:
            parts.append(f"peak {fmt.pct(ev.peak_util)}")
        now = f"now {fmt.pct(now_util)}"
        if now_util is None or now_util < g.link_enter:
            now += " (easing)"  # held open by the exit hysteresis, not saturated at this moment
        parts.append(now)
        parts.append(f"phase {phase or fmt.NA}")
        text = f" {' · '.join(parts)} "
        if not wide and len(text) > NARROW_BADGE_CHARS and ev is not None and "easing" not in now:
            # 80 columns: at full use the peak is about the reading now; it goes first
            parts = [p for p in parts if not p.startswith("peak ")]
            text = f" {' · '.join(parts)} "
        if not wide and len(text) > NARROW_BADGE_CHARS:
            # then the words in brackets (the rows below name TX and RX)
            parts[1] = f"{bus} {(direction or '').upper()}".strip() if direction != "both" else f"{bus} TX+RX"
            text = f" {' · '.join(parts)} "
        if not wide and len(text) > NARROW_BADGE_CHARS:
            parts[-1] = phase or fmt.NA  # last: the phase without its word
            text = f" {' · '.join(parts)} "
        return text, "-link"
    if g.verdict == "memory":
        now = fmt.pct(g.mem_util)
        if g.memory_proxy:
            return f" MEMORY BUSY {now} (duty-cycle proxy) · phase {phase or fmt.NA} ", "-memory"
        return f" DRAM BANDWIDTH SATURATED {now} · phase {phase or fmt.NA} ", "-memory"
    if g.verdict == "compute":
        now = fmt.pct(u.compute) if u else fmt.NA
        return f" COMPUTE SATURATED · SM {now} · phase {phase or fmt.NA} ", "-compute"
    if g.sample is None:
        return " waiting for the first reading ", "-none"
    return f" no resource saturated · phase {phase or fmt.NA} ", "-none"


def link_title(g: GpuView, room: int | None = None) -> str:
    """The panel's header line: link state now (and max), capacity per direction; in ``room`` cells
    where it can be, by shorter words (no vendor prefix, "= max" for a link at its maximum)."""
    info = g.info
    name = info.name if info else "?"
    s = g.sample
    gen = s.link_gen if s and s.link_gen is not None else (info.link.gen if info else None)
    width = s.link_width if s and s.link_width is not None else (info.link.width if info else None)
    cur = fmt.link(gen, width)
    mx = fmt.link(info.link.max_gen, info.link.max_width) if info else "n/a"
    down = ""
    if info and info.link.max_gen and gen and (gen < info.link.max_gen or (width or 0) < (info.link.max_width or 0)):
        down = " [b $warning]trained down[/]"
    cap = f"{fmt.gbps(g.ceiling_Bps)}/dir {CEILING_WORDS.get(g.ceiling_kind, g.ceiling_kind)}"
    nvl = ""
    if info and info.nvlink_capacity_Bps:
        nvl = f" · NVLink x{info.nvlink_count or '?'} {fmt.gbps(info.nvlink_capacity_Bps)}/dir"
    full = f"GPU {g.index} · {name} · PCIe {cur} (max {mx}){down} · {cap}{nvl}"
    if room is None or Text.from_markup(full).cell_len <= room:
        return full
    short = name.removeprefix("NVIDIA ")
    at = "(= max)" if cur == mx else f"(max {mx})"
    cap = cap.replace(" measured", " meas.")
    return f"GPU {g.index} · {short} · PCIe {cur} {at}{down} · {cap}{nvl}"


class GpuPanel(Vertical):
    """One GPU: verdict badge, link TX/RX vs ceiling, DRAM, SM, memory, power."""

    def __init__(self, index: int, history_ticks: int) -> None:
        super().__init__(id=f"gpu-{index}", classes="gpu-panel")
        self.index = index
        self.history_ticks = history_ticks
        self.wide = False
        self.badge = Static("", classes="badge")
        self.tx = MetricRow(hot_at=0.70, classes="row-tx")
        self.rx = MetricRow(hot_at=0.70, classes="row-rx")
        self.nvlink = MetricRow(hot_at=0.70, classes="row-nvlink")
        self.mem = MetricRow(hot_at=0.70, classes="row-mem")
        self.misc = Static("", classes="misc")
        self.legend = HistoryLegend()
        self._view: GpuView | None = None  # the last one shown (the title is refitted on a resize)
        self._verdict_cls = ""  # the badge's and the border's class now

    def compose(self) -> ComposeResult:
        with Horizontal(classes="badge-row"):
            yield self.badge
        yield self.tx
        yield self.rx
        yield self.nvlink
        yield self.mem
        yield self.misc
        yield self.legend

    @property
    def charts(self) -> list[MetricRow]:
        """The chart rows shown (NVLink only where the GPU has it)."""
        return [row for row in (self.tx, self.rx, self.nvlink, self.mem) if row.display]

    @property
    def fixed_rows(self) -> int:
        """The panel's rows besides its charts' (borders, badge, figures, legend), as laid out now."""
        return self.outer_size.height - sum(row.outer_size.height for row in self.charts)

    def _title(self) -> None:
        # On the border line: Textual keeps the corners, a border cell and a space each side and the
        # ellipsis' cell free (a title of width - 7 shows whole): the short form where the full one does not fit.
        room = self.outer_size.width - 7
        if self._view is not None:
            set_border_title(self, link_title(self._view, room if room > 0 else None))

    def on_resize(self) -> None:
        self._title()  # the width is known only once laid out: a title set before is refitted here

    def show(self, g: GpuView, frame: Frame) -> None:
        self._view = g
        self._title()
        text, cls = badge(g, frame.phase, self.wide)
        set_text(self.badge, text)  # the row's width (reverse colours only the text): no relayout
        if cls != self._verdict_cls:
            for w in (self.badge, self):
                w.remove_class("-link", "-memory", "-compute", "-none", update=False)
                w.add_class(cls, update=False)
            # The two restyled alone (issue 22: the panel's update_node_styles restyled all it holds, ~8 ms
            # with 1 GPU): no rule styles anything inside a panel by these classes (app.tcss; a test checks).
            self.app.stylesheet.update_nodes((self, self.badge), animate=True)
            self._verdict_cls = cls
        s = g.sample
        ceil = g.ceiling_Bps
        kind = {"calibrated": "calib.", "default": "default", "observed": "observed"}.get(
            g.ceiling_kind, g.ceiling_kind
        )
        for row, show, value, hist in (
            (self.tx, _show("pcie_tx_Bps"), s.pcie_tx_Bps if s else None, g.hist_tx),
            (self.rx, _show("pcie_rx_Bps"), s.pcie_rx_Bps if s else None, g.hist_rx),
        ):
            share = fmt.pct(value / ceil) if value is not None and ceil else fmt.NA
            f = fmt.FORMATS[show.fmt]
            label = f"{show.label:<8}{f(value):>10} {share:>5} of {fmt.gbps(ceil)} {kind}"
            if self.wide:
                label += f"  max {f(max((v for v in hist if v is not None), default=None))}"
            set_text(row.label, label)
            row.spark.show(hist, g.hist_phase, g.hist_start, ceil, self.history_ticks)
        self.nvlink.display = g.has_nvlink
        if g.has_nvlink:
            nvl_ceil = g.info.nvlink_capacity_Bps if g.info else None
            tx = s.nvlink_tx_Bps if s else None
            rx = s.nvlink_rx_Bps if s else None
            top = max((v for v in (tx, rx) if v is not None), default=None)
            share = fmt.pct(top / nvl_ceil) if top is not None and nvl_ceil else fmt.NA
            show = _show("nvlink_tx_Bps")
            f = fmt.FORMATS[show.fmt]
            set_text(
                self.nvlink.label,
                f"{show.label:<8}{f(top):>10} {share:>5} of {fmt.gbps(nvl_ceil)} (TX {f(tx)}, RX {f(rx)})",
            )
            self.nvlink.spark.show(g.hist_nvlink, g.hist_phase, g.hist_start, nvl_ceil, self.history_ticks)
        busy, dram = _show("mem_busy"), _show("dram_bw_util")
        if g.memory_basis == "proxy":
            mem_label = f"{busy.label:<8} {fmt.FORMATS[busy.fmt](g.mem_util):>9} (duty-cycle proxy)"
        elif g.memory_basis == "gpm":
            mem_label = f"{dram.label:<8}{fmt.FORMATS[dram.fmt](g.mem_util):>10} of peak bandwidth (GPM)"
        else:
            mem_label = f"{dram.label:<8}{fmt.NA:>10} (no DRAM or memory-busy reading)"
        set_text(self.mem.label, mem_label)
        self.mem.spark.show(g.hist_mem, g.hist_phase, g.hist_start, 1.0, self.history_ticks)
        set_text(self.misc, figures_line(s, g.info))
        self.legend.show(g.hist_span_s, g.hist_phase)


def _show(name: str) -> metrics.Show:
    show = metrics.metric(name).show
    assert show is not None, name
    return show


def figures_line(s: GpuSample | None, info: GpuInfo | None) -> str:
    """The panel's figures line: every metrics-table row shown in panel "figures", in table order."""
    parts = []
    for m in metrics.table():
        show = m.show
        if show is None or show.panel != "figures":
            continue
        f = fmt.FORMATS[show.fmt]
        text = f"{show.label} {f(s.get(m.name) if s is not None else None)}"
        if show.of is not None:
            text += f" of {f(getattr(info, show.of, None) if info is not None else None)}"
        parts.append(text)
    heat = heat_field(s)
    if heat:
        parts.append(heat)
    return " · ".join(parts)


def heat_field(s: GpuSample | None) -> str:
    """SM clock, what cuts it and the temperature, compact ("1,410 MHz power cap 71°C"); '' where the GPU gave
    none. The clock and its reason come first: on a narrow screen the line's end is cut."""
    if s is None or (s.temp_C is None and s.sm_clock_MHz is None):
        return ""
    out = [f"{s.sm_clock_MHz:,.0f} MHz"] if s.sm_clock_MHz is not None else []
    cut = clocks.label(s.clock_events)
    if cut:
        out.append(cut)
    if s.temp_C is not None:
        out.append(f"{s.temp_C:.0f}°C")
    return " ".join(out)
