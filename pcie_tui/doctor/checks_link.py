"""Doctor's link checks: the link's trained state, the slot wiring above it, and its PCIe error counters."""

from __future__ import annotations

from typing import Any

from pcie_tui.analyze.linkmodel import PCIE_ALLREDUCE_LATENCY_S, Layout, ModelShape, predict
from pcie_tui.core.model import pcie_capacity_Bps
from pcie_tui.doctor.items import FAIL, PASS, WARN, Item, gb, link_name
from pcie_tui.doctor.load import LoadReadings
from pcie_tui.doctor.nvmlfacts import GpuFacts, LinkRead, Read
from pcie_tui.doctor.topology import Chain

# The reference workload doctor prices links with (override nothing: it is an illustration).
REFERENCE_MODEL = ModelShape(
    hidden_size=8192, num_layers=80, dtype_bytes=2, name="Llama-70B-class (bf16)", source="reference"
)
REFERENCE_PROMPT_TOKENS = 4096
ERROR_COUNTERS = (
    "replay",
    "replay_rollover",
    "correctable_errors",
    "receiver_error",
    "bad_tlp",
    "bad_dllp",
    "lcrc_error",
    "naks_received",
    "naks_sent",
    "lane_error",
    "non_fatal_error",
    "unsupported_req",
)


def tp_cost(link_Bps: float, better_Bps: float, better_label: str) -> tuple[str, dict[str, Any]]:
    """What a link of ``link_Bps`` costs tensor parallelism, priced with the link model."""
    lay = Layout(tp=2, batch=1, prompt_tokens=REFERENCE_PROMPT_TOKENS)
    here = predict(REFERENCE_MODEL, lay, link_Bps)
    there = predict(REFERENCE_MODEL, lay, better_Bps)
    mb = here["tp_bytes_per_token"] / 1e6
    text = (
        f"TP=2 on a {REFERENCE_MODEL.name} model moves {mb:.1f} MB per token each way over every GPU's link: "
        f"a {REFERENCE_PROMPT_TOKENS}-token prefill needs {here['prefill']['bandwidth_time_s']:.2f} s of link time "
        f"at {gb(link_Bps)} vs {there['prefill']['bandwidth_time_s']:.2f} s at {better_label} ({gb(better_Bps)}), "
        f"and the ring runs at its slowest link; batch-1 decode is latency-bound "
        f"({int(here['allreduces_per_step'])} all-reduces x {PCIE_ALLREDUCE_LATENCY_S * 1e6:.0f} us "
        f"= {here['decode']['latency_floor_s'] * 1e3:.1f} ms per token) and barely notices"
    )
    return text, {"reference_model": REFERENCE_MODEL.name, "here": here, "better": there, "better_label": better_label}


def check_link(g: GpuFacts, load: LoadReadings) -> Item:
    r = load.links.get(g.index, g.link_idle)
    cg, cw, mg, mw = (r.cur_gen.value, r.cur_width.value, r.max_gen.value, r.max_width.value)
    loaded = load.loaded.get(g.index, False)
    sysfs = load.sysfs_links.get(g.index)
    ev = [
        f"NVML: current {link_name(cg, cw)}, max {link_name(mg, mw)} ({'under load' if loaded else 'not under load'}: "
        f"{load.detail})"
    ]
    if sysfs and sysfs[0] is not None:
        ev.append(f"sysfs current_link_*: {link_name(*sysfs)}")
    gmg = r.gpu_max_gen.value if r.gpu_max_gen.ok else None
    data = {"under_load": loaded, "how": load.how, "reading": r.to_json()}
    if None in (cg, cw, mg, mw):
        return Item(
            "link",
            WARN,
            "NVML did not report the link state",
            "Check the driver; doctor cannot judge the link without it.",
            g.index,
            ev + [f"unavailable: {', '.join(_unread_link_fields(r))}"],
            data,
        )
    title_now = f"{link_name(cg, cw)} of max {link_name(mg, mw)}"
    if gmg is not None and mg is not None and mg < gmg:
        ev.append(f"the card supports Gen{gmg} but the slot/platform tops out at Gen{mg}")
    if cg < mg or cw < mw:
        return _below_maximum(g, title_now, loaded, load.how, ev, data)
    if gmg is not None and mg < gmg:
        return Item(
            "link",
            WARN,
            f"{title_now}: the slot caps the card below its Gen{gmg}",
            "Move the card to a slot (or enable the BIOS setting) that runs at the card's own generation.",
            g.index,
            ev,
            data,
        )
    status_note = "under load" if loaded else "even idle"
    return Item("link", PASS, f"link at its maximum {status_note}: {title_now}", "Nothing to do.", g.index, ev, data)


def _unread_link_fields(r: LinkRead) -> list[str]:
    """The link state fields NVML gave an error for instead of a value."""
    fields = (("cur_gen", r.cur_gen), ("cur_width", r.cur_width), ("max_gen", r.max_gen), ("max_width", r.max_width))
    return [k for k, v in fields if not v.ok]


def _below_maximum(g: GpuFacts, title_now: str, loaded: bool, how: str, ev: list[str], data: dict[str, Any]) -> Item:
    """A link below its maximum: downtrained only if doctor itself drove it; busy with the engine or
    idle, it cannot tell (idle links train down to save power)."""
    if loaded and how == "engine":
        return Item(
            "link",
            WARN,
            f"link below its maximum while the GPU was busy: {title_now}",
            "Rerun doctor with PyTorch or cuda-python installed so it can drive the link itself; if it "
            "stays below its maximum, reseat the card and check risers and the BIOS slot speed.",
            g.index,
            ev,
            data,
        )
    if loaded:
        return Item(
            "link",
            FAIL,
            f"link downtrained under load: {title_now}",
            "Reseat the card, drop any riser, and set the slot to its full generation in the BIOS: "
            "a link that stays below its maximum under traffic is losing bandwidth.",
            g.index,
            ev,
            data,
        )
    return Item(
        "link",
        WARN,
        f"idle link reads {title_now}; cannot judge downtraining without load",
        "Rerun with PyTorch or cuda-python installed (doctor then generates traffic) or while the engine "
        "serves: idle links train down to save power.",
        g.index,
        ev,
        data,
    )


def check_chain(g: GpuFacts, chain: Chain | None, others: list[Chain]) -> Item:
    if chain is None or not chain.found:
        ev = chain.evidence if chain else ["no sysfs tree read"]
        return Item(
            "chain",
            WARN,
            "bridge chain unknown: the GPU is not in sysfs",
            "Run doctor on the host itself (not inside a container without /sys) to see the slot wiring.",
            g.index,
            ev,
        )
    ev = _chain_evidence(chain)
    data = chain.to_json()
    n = chain.narrowest
    dev = chain.device
    card_Bps = pcie_capacity_Bps(dev.max_gen, dev.max_width) if dev else None
    if chain.attach == "direct":
        return Item(
            "chain",
            PASS,
            "GPU on the root bus; no bridge visible (virtual machine or integrated)",
            "The host's real slot wiring is hidden here; run doctor on the host to check it.",
            g.index,
            ev,
            data,
        )
    best_other = max((c.narrowest.max_Bps or 0.0 for c in others if c.narrowest is not None), default=0.0)
    ceiling = (n.max_Bps if n is not None else None) or 0.0
    if chain.attach == "chipset":
        return _behind_chipset(g, chain, ceiling, best_other, ev, data)
    if dev is not None and n is not None and card_Bps and ceiling and ceiling < card_Bps * 0.99:
        text, cost = tp_cost(ceiling, card_Bps, f"the card's own {link_name(dev.max_gen, dev.max_width)}")
        ev.append(text)
        data["tp_cost"] = cost
        return Item(
            "chain",
            WARN,
            f"slot narrower than the card: {link_name(n.max_gen, n.max_width)} for a "
            f"{link_name(dev.max_gen, dev.max_width)} card ({gb(ceiling)} per direction)",
            "Fine for batch-1 decode (a few percent at most); for prefill-heavy or batched tensor parallelism "
            "use a slot wired at the card's full width.",
            g.index,
            ev,
            data,
        )
    if chain.attach == "switch":
        return _behind_switch(g, chain, ceiling, ev, data)
    return Item(
        "chain",
        PASS,
        f"on CPU lanes: {link_name(n.max_gen, n.max_width) if n else 'link n/a'}",
        "Nothing to do.",
        g.index,
        ev,
        data,
    )


def _chain_evidence(chain: Chain) -> list[str]:
    """What sysfs showed of a found chain: its own evidence, every hop, the narrowest hop and who shares it."""
    ev = list(chain.evidence)
    for h in chain.hops:
        ev.append(
            f"hop {h.label()} ({h.role}): now {link_name(h.cur_gen, h.cur_width)}, max {link_name(h.max_gen, h.max_width)}"
            f" = {gb(h.max_Bps)} per direction"
        )
    n = chain.narrowest
    if n is not None:
        ev.append(f"narrowest link: {n.label()} at {link_name(n.max_gen, n.max_width)} = {gb(n.max_Bps)} per direction")
    if chain.sharers:
        ev.append("shared with: " + ", ".join(f"{s.bdf} {s.kind_name}" for s in chain.sharers))
    return ev


def _behind_chipset(
    g: GpuFacts, chain: Chain, ceiling: float, best_other: float, ev: list[str], data: dict[str, Any]
) -> Item:
    """A GPU behind the chipset fails: its link is shared, and priced against the best other GPU's
    link (``best_other``) or Gen4 x16, whichever is faster."""
    if chain.hidden_uplink:
        ev.append(f"uplink not visible in sysfs: {chain.hidden_uplink}")
    better = max(best_other, pcie_capacity_Bps(4, 16) or 0.0)
    label = "the other GPU's link" if best_other >= (pcie_capacity_Bps(4, 16) or 0.0) else "Gen4 x16"
    if ceiling:
        text, cost = tp_cost(ceiling, better, label)
        ev.append(text)
        data["tp_cost"] = cost
    return Item(
        "chain",
        FAIL,
        f"GPU behind the chipset: ceiling {gb(ceiling or None)} shared with {len(chain.sharers)} other device(s)",
        "Move this GPU to a CPU-attached slot (x8 or better) or keep it out of tensor parallelism: every "
        "all-reduce waits on this shared chipset link.",
        g.index,
        ev,
        data,
    )


def _behind_switch(g: GpuFacts, chain: Chain, ceiling: float, ev: list[str], data: dict[str, Any]) -> Item:
    """A GPU behind a PCIe switch passes; the title says how many other GPUs share its uplink."""
    gpus_sharing = [s for s in chain.sharers if s.base_class in (0x0300, 0x0302)]
    title = f"behind a PCIe switch; uplink {gb(ceiling or None)}"
    if gpus_sharing:
        title += f" shared with {len(gpus_sharing)} other GPU(s)"
    return Item(
        "chain",
        PASS,
        title,
        "Peer traffic between GPUs on one switch stays on the switch; host traffic of all of them shares the uplink.",
        g.index,
        ev,
        data,
    )


def check_errors(g: GpuFacts, after: dict[str, Read]) -> Item:
    before = g.pcie_counters_before
    ev: list[str] = []
    deltas: dict[str, Any] = {}
    unsupported: list[str] = []
    counts = []
    for k in before:
        b, a = before[k], after.get(k, Read(error="not read"))
        if not b.ok or not a.ok:
            unsupported.append(k)
            continue
        deltas[k] = a.value - b.value
        counts.append(f"{k} {a.value}" + (f" (+{deltas[k]} during the check)" if deltas[k] else ""))
    if counts:
        ev.append("NVML counts since boot: " + ", ".join(counts))
    if unsupported:
        ev.append("n/a: " + ", ".join(unsupported))
    data = {
        "before": {k: v.to_json() for k, v in before.items()},
        "after": {k: v.to_json() for k, v in after.items()},
        "delta": deltas,
    }
    fatal = after.get("fatal_error")
    if fatal is not None and fatal.ok and fatal.value:
        return Item(
            "pcie_errors",
            FAIL,
            f"{fatal.value} fatal PCIe error(s) recorded",
            "Check the card's seating, riser and power, and the kernel log (AER) for the failing link.",
            g.index,
            ev,
            data,
        )
    rising = {k: v for k, v in deltas.items() if k in ERROR_COUNTERS and v > 0}
    if rising:
        return Item(
            "pcie_errors",
            WARN,
            "PCIe error counters rose during the check: " + ", ".join(f"{k} +{v}" for k, v in rising.items()),
            "Replays and bad TLPs under load cost bandwidth: reseat the card and remove risers or extenders.",
            g.index,
            ev,
            data,
        )
    if not deltas:
        return Item(
            "pcie_errors", PASS, "PCIe error counters not available from NVML", "Nothing to do.", g.index, ev, data
        )
    return Item("pcie_errors", PASS, "no PCIe errors during the check", "Nothing to do.", g.index, ev, data)
