"""Link health: PCIe replays and AER errors that rise, and a link that trained down under load.

* **Counters** (``pcie_replays`` from NVML, ``aer_correctable`` / ``_nonfatal`` / ``_fatal`` from sysfs;
  cumulative, read about once a second): each rise between two reads is charged to the later read's
  phase; rises closer than :data:`MERGE_S` form one event with its count, rate and phase ("1,203 PCIe
  replays during prefill (40/s): check the riser or the slot"). A drop is a reset (driver reload): the
  count starts again from the new value.
* **Downtraining under load**: the link's current generation or width under its maximum while PCIe
  traffic (TX or RX) is above :data:`LOAD_Bps`. An idle link trains down to save power by design: not
  an event.

Pure bookkeeping over the analyzer's chunks (:mod:`pcie_tui.analyze.columns`); no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcie_tui.analyze.columns import COL, Chunk
from pcie_tui.core.model import SessionHeader

COUNTERS = {
    "pcie_replays": ("PCIe replays", "check the riser or the slot (reseat the card; a riser or retimer that "
                     "corrupts packets shows here first)"),
    "aer_correctable": ("AER correctable errors", "check the riser, slot and cabling: the link corrects these, "
                        "at a cost in bandwidth"),
    "aer_nonfatal": ("AER non-fatal errors", "check the card, riser and slot: transactions were lost and retried"),
    "aer_fatal": ("AER fatal errors", "the link failed: check the card and slot, and the kernel log (dmesg)"),
}  # fmt: skip
SHORT = {
    "pcie_replays": "PCIe replays",
    "aer_correctable": "AER corrected",
    "aer_nonfatal": "AER non-fatal",
    "aer_fatal": "AER fatal",
    "link_down": "downtrained",
}
MERGE_S = 10.0  # rises of one counter closer than this are one event
LOAD_Bps = 0.25e9  # PCIe traffic above this (either direction) is load: a downtrained link then is an event
DOWN_MERGE_S = 2.0
# The link state is re-read about once a second (NvmlCollector.link_refresh_s) while traffic is read every
# tick: an idle link that retrains up as a burst starts reads as downtrained for up to a second. An event
# needs the link under its maximum under load for at least this long.
DOWN_MIN_S = 2.0


@dataclass
class HealthEvent:
    """One link-health event of one GPU (a frozen copy goes to the TUI)."""

    gpu: int
    kind: str  # a COUNTERS key, or "link_down"
    start: float
    end: float
    count: float = 0.0  # counter rise over the event
    phases: dict[str, float] = field(default_factory=dict)  # phase -> count (counters) or ticks (link_down)
    gen: int | None = None  # link_down: the state it ran at, and its maximum
    width: int | None = None
    max_gen: int | None = None
    max_width: int | None = None
    peak_Bps: float = 0.0
    open: bool = True
    listed: bool = field(default=False, compare=False)  # in LinkHealth.events (link_down: once held long enough)

    @property
    def phase(self) -> str | None:
        return max(self.phases, key=self.phases.__getitem__) if self.phases else None

    @property
    def rate_per_s(self) -> float | None:
        span = self.end - self.start
        return self.count / span if span > 0 and self.kind != "link_down" else None

    def reason(self) -> str:
        """What happened, in at most 15 characters (the TUI's resource column)."""
        return SHORT[self.kind]

    def detail(self) -> str:
        """The short form for the TUI's events box: "1,203 at 40.1/s", "Gen3 x8 of Gen5 x16"."""
        if self.kind == "link_down":
            return f"Gen{self.gen} x{self.width}"
        rate = self.rate_per_s
        return f"{self.count:,.0f}" + (f" at {rate:,.1f}/s" if rate is not None else "")

    def text(self) -> str:
        """One line in plain words, with the rate, the phase and what to check."""
        during = f" during {self.phase}" if self.phase else ""
        if self.kind == "link_down":
            return (
                f"PCIe link at Gen{self.gen} x{self.width} of Gen{self.max_gen} x{self.max_width} under load "
                f"({self.peak_Bps / 1e9:.1f} GB/s){during}: reseat the card, check the slot, riser and BIOS link "
                "settings"
            )
        name, fix = COUNTERS[self.kind]
        rate = self.rate_per_s
        per_s = f" ({rate:,.1f}/s)" if rate is not None else ""
        return f"{self.count:,.0f} {name}{during}{per_s}: {fix}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpu": self.gpu,
            "kind": self.kind,
            "start": self.start,
            "end": None if self.open else self.end,
            "last": self.end,
            "phase": self.phase,
            "text": self.text(),
        }
        if self.kind == "link_down":
            out |= {"gen": self.gen, "width": self.width, "max_gen": self.max_gen, "max_width": self.max_width,
                    "peak_Bps": self.peak_Bps}  # fmt: skip
        else:
            out |= {"count": self.count, "rate_per_s": self.rate_per_s}
        return out


@dataclass
class _Counter:
    last: float | None = None  # the last read value
    last_t: float | None = None
    event: HealthEvent | None = None  # the event still collecting rises


class LinkHealth:
    """Fed the analyzer's chunks in order (after its phase rule); ``events`` in opening order."""

    def __init__(self, header: SessionHeader) -> None:
        self.events: list[HealthEvent] = []
        self.read: set[str] = set()  # counters the recording holds at all
        self._counters: dict[tuple[int, str], _Counter] = {}
        self._down: dict[int, HealthEvent] = {}
        self._max = {g.index: (g.link.max_gen, g.link.max_width) for g in header.gpus}
        self._max_lut: tuple[np.ndarray, np.ndarray] | None = None

    def feed_chunk(self, ch: Chunk) -> None:
        cols = ch.cols
        for key in COUNTERS:
            col = cols[COL[key]]
            if bool(np.isnan(col).all()):
                continue
            for pos in np.flatnonzero(~np.isnan(col)).tolist():
                ti = int(ch.tick_of[pos])
                self._count(int(ch.index[pos]), key, ch.t[ti], float(col[pos]), ch.phase[ti])
        self._link(ch)

    def _count(self, gi: int, key: str, t: float, v: float, phase: Any) -> None:
        self.read.add(key)
        c = self._counters.setdefault((gi, key), _Counter())
        prev, prev_t = c.last, c.last_t
        c.last, c.last_t = v, t
        ev = c.event
        if ev is not None and t - ev.end > MERGE_S:
            ev.open = False
            c.event = ev = None
        if prev is None or prev_t is None or v <= prev:
            return  # the first read, no rise, or a reset (driver reload): counting starts from here
        if ev is None:
            ev = c.event = HealthEvent(gi, key, start=prev_t, end=t)
            self.events.append(ev)
        ev.count += v - prev
        ev.end = t
        if phase is not None:
            ev.phases[str(phase)] = ev.phases.get(str(phase), 0.0) + (v - prev)

    def _link(self, ch: Chunk) -> None:
        cols = ch.cols
        gen, width = cols[COL["link_gen"]], cols[COL["link_width"]]
        mg, mw = self._max_arrays(ch.index)
        with np.errstate(invalid="ignore"):
            traffic = np.fmax(cols[COL["pcie_tx_Bps"]], cols[COL["pcie_rx_Bps"]])
            load = traffic > LOAD_Bps
            down = load & ((gen < mg) | (width < mw))
            full = load & ~down & (gen >= mg) & (width >= mw)  # under load at its maximum: an event ends
        for gi in dict.fromkeys([*ch.index[down].tolist(), *self._down]):
            mine = ch.index == gi
            self._link_gpu(ch, int(gi), np.flatnonzero(down & mine), np.flatnonzero(full & mine), gen, width, traffic)
        last = ch.t[-1]
        for ev in self._down.values():
            if last - ev.end > DOWN_MERGE_S:
                ev.open = False
        for c in self._counters.values():
            if c.event is not None and last - c.event.end > MERGE_S:
                c.event.open = False
                c.event = None

    def _link_gpu(
        self, ch: Chunk, gi: int, downs: np.ndarray, fulls: np.ndarray, gen: np.ndarray, width: np.ndarray,
        traffic: np.ndarray,
    ) -> None:  # fmt: skip
        """One GPU's ticks under load below its maximum link state (``downs``), ended by any at it (``fulls``)."""
        prev = -1
        for pos in downs.tolist():
            t = ch.t[int(ch.tick_of[pos])]
            ev = self._down.get(gi)
            ended = int(np.searchsorted(fulls, pos)) > int(np.searchsorted(fulls, prev, "right"))  # one between
            if ev is not None and (ended or t - ev.end > DOWN_MERGE_S):
                ev.open = False
                del self._down[gi]
                ev = None
            prev = pos
            g, w = int(gen[pos]), int(width[pos])
            if ev is None:
                m = self._max.get(gi, (None, None))
                ev = self._down[gi] = HealthEvent(gi, "link_down", start=t, end=t, gen=g, width=w, max_gen=m[0],
                                                  max_width=m[1])  # fmt: skip
            ev.end = t
            if not ev.listed and ev.end - ev.start >= DOWN_MIN_S:
                ev.listed = True
                self.events.append(ev)  # held long enough: not a stale link read at the start of a burst
            ev.gen, ev.width = min(ev.gen or g, g), min(ev.width or w, w)
            ev.peak_Bps = max(ev.peak_Bps, float(traffic[pos]))
            ph = ch.phase[int(ch.tick_of[pos])]
            if ph is not None:
                ev.phases[str(ph)] = ev.phases.get(str(ph), 0.0) + 1
        ev = self._down.get(gi)
        if ev is not None and fulls.size and int(fulls[-1]) > prev:
            ev.open = False
            del self._down[gi]

    def _max_arrays(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each GPU-sample's maximum link generation and width (NaN where the header does not say)."""
        top = int(index.max()) + 1 if index.size else 0
        if self._max_lut is None or self._max_lut[0].size < top:
            size = max(top, max(self._max, default=-1) + 1)
            gen, width = np.full(size, np.nan), np.full(size, np.nan)
            for gi, (g, w) in self._max.items():
                gen[gi], width[gi] = _or_nan(g), _or_nan(w)
            self._max_lut = (gen, width)
        return self._max_lut[0][index], self._max_lut[1][index]

    def finish(self) -> None:
        for ev in self.events:
            ev.open = False

    def report(self) -> dict[str, Any]:
        """``link_health`` of ``report --json``: what was read, and every event."""
        return {
            "read": sorted(self.read),
            "events": [e.to_json() for e in self.events],
            "rule": (
                f"a counter that rises (rises within {MERGE_S:g} s are one event); the link under its maximum "
                f"generation or width while PCIe traffic exceeds {LOAD_Bps / 1e9:g} GB/s (idle downtraining is "
                "power saving, not an event)"
            ),
        }


def _or_nan(v: int | None) -> float:
    return float(v) if v is not None else float("nan")
