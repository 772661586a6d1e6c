"""Doctor's line items: pass / warn / fail, each with evidence and one sentence of advice.

:func:`run_checks` runs every check in report order; the checks live by subject in
``checks_link`` (link state, slot wiring, PCIe errors), ``checks_numa`` (process
placement) and ``checks_peers`` (P2P, NVLink, topology), on the vocabulary of
:mod:`pcie_tui.doctor.items`.
"""

from __future__ import annotations

from pcie_tui.doctor.checks_link import check_chain, check_errors, check_link
from pcie_tui.doctor.checks_numa import check_numa
from pcie_tui.doctor.checks_peers import check_nvlink, check_pair
from pcie_tui.doctor.items import PASS, DoctorData, Item


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
