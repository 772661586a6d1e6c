"""Doctor's line items: pass / warn / fail, each with evidence and one sentence of advice."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcie_tui.analyze.linkmodel import PCIE_ALLREDUCE_LATENCY_S, Layout, ModelShape, predict
from pcie_tui.doctor.load import LoadReadings
from pcie_tui.doctor.numa import ProcPlacement, format_cpulist
from pcie_tui.doctor.nvmlfacts import TOPOLOGY_MEANING, GpuFacts, Read
from pcie_tui.doctor.topology import Chain
from pcie_tui.model import pcie_capacity_Bps

PASS, WARN, FAIL = "pass", "warn", "fail"
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


@dataclass
class Item:
    check: str
    status: str
    title: str
    advice: str
    gpu: int | list[int] | None = None
    evidence: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "gpu": self.gpu,
            "status": self.status,
            "title": self.title,
            "evidence": self.evidence,
            "advice": self.advice,
            "data": self.data,
        }


@dataclass
class DoctorData:
    gpus: list[GpuFacts]
    pairs: dict[tuple[int, int], dict[str, Any]]
    chains: dict[int, Chain]
    load: LoadReadings
    counters_after: dict[int, dict[str, Read]]
    node_cpus: dict[int, set[int]]
    placements: dict[int, ProcPlacement]  # pid -> placement
    pid_gpus: dict[int, list[int]]  # pid -> GPU indices it uses (all GPUs for --pid when unknown)
    pid_errors: dict[int, str] = field(default_factory=dict)


def _gb(bps: float | None) -> str:
    from pcie_tui.analyze.linkmodel import fmt_gbs

    return fmt_gbs(bps)


def _link(gen: Any, width: Any) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def tp_cost(link_Bps: float, better_Bps: float, better_label: str) -> tuple[str, dict[str, Any]]:
    """What a link of ``link_Bps`` costs tensor parallelism, priced with the link model."""
    lay = Layout(tp=2, batch=1, prompt_tokens=REFERENCE_PROMPT_TOKENS)
    here = predict(REFERENCE_MODEL, lay, link_Bps)
    there = predict(REFERENCE_MODEL, lay, better_Bps)
    mb = here["tp_bytes_per_token"] / 1e6
    text = (
        f"TP=2 on a {REFERENCE_MODEL.name} model moves {mb:.1f} MB per token each way over every GPU's link: "
        f"a {REFERENCE_PROMPT_TOKENS}-token prefill needs {here['prefill']['bandwidth_time_s']:.2f} s of link time "
        f"at {_gb(link_Bps)} vs {there['prefill']['bandwidth_time_s']:.2f} s at {better_label} ({_gb(better_Bps)}), "
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
        f"NVML: current {_link(cg, cw)}, max {_link(mg, mw)} ({'under load' if loaded else 'not under load'}: "
        f"{load.detail})"
    ]
    if sysfs and sysfs[0] is not None:
        ev.append(f"sysfs current_link_*: {_link(*sysfs)}")
    gmg = r.gpu_max_gen.value if r.gpu_max_gen.ok else None
    data = {"under_load": loaded, "how": load.how, "reading": r.to_json()}
    if None in (cg, cw, mg, mw):
        missing = [
            k
            for k, v in (
                ("cur_gen", r.cur_gen),
                ("cur_width", r.cur_width),
                ("max_gen", r.max_gen),
                ("max_width", r.max_width),
            )
            if not v.ok
        ]
        return Item(
            "link",
            WARN,
            "NVML did not report the link state",
            "Check the driver; doctor cannot judge the link without it.",
            g.index,
            ev + [f"unavailable: {', '.join(missing)}"],
            data,
        )
    title_now = f"{_link(cg, cw)} of max {_link(mg, mw)}"
    if gmg is not None and mg is not None and mg < gmg:
        ev.append(f"the card supports Gen{gmg} but the slot/platform tops out at Gen{mg}")
    if cg < mg or cw < mw:
        if loaded and load.how == "engine":
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
    ev = list(chain.evidence)
    for h in chain.hops:
        ev.append(
            f"hop {h.label()} ({h.role}): now {_link(h.cur_gen, h.cur_width)}, max {_link(h.max_gen, h.max_width)}"
            f" = {_gb(h.max_Bps)} per direction"
        )
    data = chain.to_json()
    n = chain.narrowest
    dev = chain.device
    card_Bps = pcie_capacity_Bps(dev.max_gen, dev.max_width) if dev else None
    if n is not None:
        ev.append(f"narrowest link: {n.label()} at {_link(n.max_gen, n.max_width)} = {_gb(n.max_Bps)} per direction")
    if chain.sharers:
        ev.append("shared with: " + ", ".join(f"{s.bdf} {s.kind_name}" for s in chain.sharers))
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
            f"GPU behind the chipset: ceiling {_gb(ceiling or None)} shared with {len(chain.sharers)} other device(s)",
            "Move this GPU to a CPU-attached slot (x8 or better) or keep it out of tensor parallelism: every "
            "all-reduce waits on this shared chipset link.",
            g.index,
            ev,
            data,
        )
    if dev is not None and n is not None and card_Bps and ceiling and ceiling < card_Bps * 0.99:
        text, cost = tp_cost(ceiling, card_Bps, f"the card's own {_link(dev.max_gen, dev.max_width)}")
        ev.append(text)
        data["tp_cost"] = cost
        return Item(
            "chain",
            WARN,
            f"slot narrower than the card: {_link(n.max_gen, n.max_width)} for a "
            f"{_link(dev.max_gen, dev.max_width)} card ({_gb(ceiling)} per direction)",
            "Fine for batch-1 decode (a few percent at most); for prefill-heavy or batched tensor parallelism "
            "use a slot wired at the card's full width.",
            g.index,
            ev,
            data,
        )
    if chain.attach == "switch":
        gpus_sharing = [s for s in chain.sharers if s.base_class in (0x0300, 0x0302)]
        title = f"behind a PCIe switch; uplink {_gb(ceiling or None)}"
        if gpus_sharing:
            title += f" shared with {len(gpus_sharing)} other GPU(s)"
        return Item(
            "chain",
            PASS,
            title,
            "Peer traffic between GPUs on one switch stays on the switch; host traffic "
            "of all of them shares the uplink.",
            g.index,
            ev,
            data,
        )
    return Item(
        "chain",
        PASS,
        f"on CPU lanes: {_link(n.max_gen, n.max_width) if n else 'link n/a'}",
        "Nothing to do.",
        g.index,
        ev,
        data,
    )


def check_numa(g: GpuFacts, chain: Chain | None, d: DoctorData) -> Item:
    nvml_node = (
        g.numa_node.value if g.numa_node.ok and g.numa_node.value is not None and g.numa_node.value >= 0 else None
    )
    node = nvml_node if nvml_node is not None else (chain.numa_node if chain else None)
    src = "NVML" if nvml_node is not None else ("sysfs numa_node" if node is not None else None)
    ev = [
        f"GPU NUMA node: {node if node is not None else 'n/a'} ({src or 'NVML: ' + str(g.numa_node.error) + '; sysfs: -1/absent'})"
    ]
    if g.cpu_affinity.ok:
        ev.append(f"NVML ideal CPU affinity: {format_cpulist(g.cpu_affinity.value)}")
    data: dict[str, Any] = {
        "gpu_node": node,
        "node_source": src,
        "nodes": {k: format_cpulist(v) for k, v in d.node_cpus.items()},
    }
    pids = [p for p, gl in d.pid_gpus.items() if g.index in gl]
    for p in pids:
        if p in d.pid_errors:
            ev.append(f"pid {p}: {d.pid_errors[p]}")
    placements = [d.placements[p] for p in pids if p in d.placements]
    data["processes"] = [pl.to_json() for pl in placements]
    for pl in placements:
        allowed_nodes = sorted(n for n, c in d.node_cpus.items() if c & pl.cpus_allowed)
        ev.append(
            f"pid {pl.pid} ({pl.name}): Cpus_allowed_list {format_cpulist(pl.cpus_allowed)} (nodes {allowed_nodes}), "
            f"Mems_allowed_list {format_cpulist(pl.mems_allowed)}, numa_maps policy {pl.policies or 'n/a'}, "
            f"pages per node {pl.pages_per_node or 'n/a'}"
        )
    if len(d.node_cpus) <= 1 or node is None:
        return Item(
            "numa",
            PASS,
            "single NUMA node: placement cannot be wrong" if len(d.node_cpus) <= 1 else "GPU reports no NUMA node",
            "Nothing to do.",
            g.index,
            ev,
            data,
        )
    if not placements:
        return Item(
            "numa",
            PASS,
            f"GPU on node {node}; no process to check",
            "Pass --pid (or attach to the engine) to check its CPU and memory placement.",
            g.index,
            ev,
            data,
        )
    near = d.node_cpus.get(node, set())
    worst, title, advice = PASS, f"processes placed on the GPU's node {node}", "Nothing to do."
    for pl in placements:
        allowed_nodes = sorted(n for n, c in d.node_cpus.items() if c & pl.cpus_allowed)
        far_pages = sum(v for k, v in pl.pages_per_node.items() if k != node)
        total_pages = sum(pl.pages_per_node.values())
        if not (pl.cpus_allowed & near) or (pl.mems_allowed and node not in pl.mems_allowed):
            worst, title = FAIL, f"NUMA mismatch: pid {pl.pid} is confined away from the GPU's node {node}"
            advice = f"Start the engine with numactl --cpunodebind={node} --membind={node} so its pinned buffers and threads sit next to the GPU."
        elif total_pages and far_pages > total_pages / 2 and worst != FAIL:
            worst, title = WARN, f"most of pid {pl.pid}'s memory ({far_pages}/{total_pages} pages) is off node {node}"
            advice = (
                f"Bind memory with numactl --membind={node}: host<->GPU copies from the far node cross the socket link."
            )
        elif len(allowed_nodes) > 1 and worst == PASS:
            worst, title = WARN, f"pid {pl.pid} may run on nodes {allowed_nodes}, the GPU is on node {node}"
            advice = f"Pin the engine with numactl --cpunodebind={node} --membind={node} (or taskset) to keep it next to the GPU."
    return Item("numa", worst, title, advice, g.index, ev, data)


_FIXABLE_P2P = {"chipset not supported", "IOH topology not supported", "disabled by regkey"}


def check_pair(a: GpuFacts, b: GpuFacts, ab: dict[str, Any], ba: dict[str, Any]) -> Item:
    ev = [
        f"GPU{a.index}->GPU{b.index}: read {ab['read']}, write {ab['write']}, NVLink {ab['nvlink']}",
        f"GPU{b.index}->GPU{a.index}: read {ba['read']}, write {ba['write']}, NVLink {ba['nvlink']}",
    ]
    topo = ab.get("topology")
    if ab.get("nvlinks_to_peer"):
        ev.append(f"{ab['nvlinks_to_peer']} NVLink(s) join them")
    if topo:
        ev.append(f"common ancestor {topo}: {TOPOLOGY_MEANING.get(topo, '')}")
    data = {"a_to_b": ab, "b_to_a": ba}
    bad = [s for s in (ab["read"], ab["write"], ba["read"], ba["write"]) if s != "OK"]
    pair = [a.index, b.index]
    if not bad:
        via = "NVLink" if ab["nvlink"] == "OK" else "PCIe"
        return Item(
            "p2p", PASS, f"GPU{a.index}<->GPU{b.index}: P2P read/write OK over {via}", "Nothing to do.", pair, ev, data
        )
    reason = bad[0]
    if reason in _FIXABLE_P2P:
        advice = {
            "chipset not supported": "A GPU behind the chipset cannot reach its peer directly: move both GPUs to CPU-attached slots.",
            "IOH topology not supported": "The GPUs hang off different root complexes or sockets: put both on one socket's slots.",
            "disabled by regkey": "P2P is disabled in the driver settings (registry key): re-enable it.",
        }[reason]
        status = FAIL
    else:
        advice = (
            "This GPU pair has no peer access (typical of GeForce cards): tensor-parallel all-reduces bounce "
            "through host memory and vLLM's custom all-reduce is off; prefer NVLink, or pipeline parallelism."
        )
        status = WARN
    return Item("p2p", status, f"GPU{a.index}<->GPU{b.index}: no P2P ({reason})", advice, pair, ev, data)


def topology_matrix(gpus: list[GpuFacts], pairs: dict[tuple[int, int], dict[str, Any]]) -> list[list[str]]:
    """``nvidia-smi topo -m``-style cells: X, NV#, PIX, PXB, PHB, NODE, SYS (n/a when NVML would not say)."""
    rows = []
    for a in gpus:
        row = []
        for b in gpus:
            if a.index == b.index:
                row.append("X")
                continue
            p = pairs.get((a.index, b.index), {})
            nv = p.get("nvlinks_to_peer") or 0
            row.append(f"NV{nv}" if nv else (p.get("topology") or "n/a"))
        rows.append(row)
    return rows


def check_nvlink(g: GpuFacts) -> Item:
    if g.nvlinks is None:
        return Item(
            "nvlink",
            PASS,
            "no NVLink (PCIe only)",
            "Nothing to do.",
            g.index,
            [f"nvmlDeviceGetNvLinkState: {g.nvlink_error}"],
            {"links": None},
        )
    active = [ln for ln in g.nvlinks if ln["active"]]
    speed = g.nvlink_speed_MBps.value if g.nvlink_speed_MBps.ok else None
    ev = [
        f"{len(active)} of {len(g.nvlinks)} NVLink(s) active"
        + (f", version {active[0].get('version')}" if active else ""),
        f"link speed (NVML field NVLINK_SPEED_MBPS_COMMON): {f'{speed} MB/s per link' if speed else 'n/a (' + str(g.nvlink_speed_MBps.error) + ')'}",
    ]
    peers = sorted({str(ln["remote_bdf"]) for ln in active if ln.get("remote_bdf")})
    if peers:
        ev.append("peers: " + ", ".join(peers))
    data = {
        "active": len(active),
        "links": g.nvlinks,
        "speed_MBps": speed,
        "total_Bps": speed * 1e6 * len(active) if speed else None,
    }
    if active and len(active) < len(g.nvlinks):
        return Item(
            "nvlink",
            WARN,
            f"{len(g.nvlinks) - len(active)} of {len(g.nvlinks)} NVLinks down",
            "Reseat the NVLink bridge: a partly trained bridge carries a fraction of its bandwidth.",
            g.index,
            ev,
            data,
        )
    title = f"{len(active)} NVLink(s) active" if active else "NVLink present, no link active (no bridge)"
    return Item("nvlink", PASS, title, "Nothing to do.", g.index, ev, data)


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


def run_checks(d: DoctorData) -> list[Item]:
    items: list[Item] = []
    chains = d.chains
    for g in d.gpus:
        items.append(check_link(g, d.load))
        others = [c for i, c in chains.items() if i != g.index]
        items.append(check_chain(g, chains.get(g.index), others))
        items.append(check_numa(g, chains.get(g.index), d))
        items.append(check_nvlink(g))
        items.append(check_errors(g, d.counters_after.get(g.index, {})))
    for i, a in enumerate(d.gpus):
        for b in d.gpus[i + 1 :]:
            items.append(check_pair(a, b, d.pairs[(a.index, b.index)], d.pairs[(b.index, a.index)]))
    if len(d.gpus) == 1:
        items.append(Item("p2p", PASS, "single GPU: no peers", "Nothing to do.", None, []))
    return items
