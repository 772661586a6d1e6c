"""Convert the raw H200 NVML probe (../shared/data) into a pcie-tui recording.

The probe read GPM over windows shorter than GPM's 100 ms minimum, so about
half its windows are void: DRAM_BW_UTIL is NaN and every other metric reads
exactly 0. A void window becomes null for every GPM figure (never 0), as the
live collector does. PCIe, DRAM and SM all come from GPM (PCIe MiB/s x 2^20);
mem_busy is NVML's utilization.memory. Each tick keeps the probe's phase label
as ``label``.

usage: python scripts/convert_probe.py PROBE.json OUT.jsonl[.gz]
"""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone

from pcie_tui.core.model import GpuInfo, GpuSample, LinkInfo, Sample, SessionHeader, pcie_capacity_Bps
from pcie_tui.recording.writer import RecordingWriter


def _finite(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def convert(probe: dict, out: str) -> int:
    st = probe["static"]
    link = LinkInfo(
        gen=st["curr_gen"],
        width=st["curr_width"],
        max_gen=st["max_gen"],
        max_width=st["max_width"],
        capacity_Bps=pcie_capacity_Bps(st["curr_gen"], st["curr_width"]),
    )
    gpu = GpuInfo(
        index=0,
        uuid=st.get("uuid", "GPU-h200-probe"),
        name=st["name"],
        pci_bus_id=st["pci_bus_id"],
        link=link,
        memory_total_bytes=st["mem"][0],
        metrics_source="gpm",
    )
    created = datetime.fromtimestamp(probe["samples"][0]["t"], timezone.utc).isoformat()
    header = SessionHeader(
        created=created,
        host="h200-probe",
        tool_version="probe-2026-12-02",
        gpus=(gpu,),
        interval_s=0.05,
        extra={
            "source": "converted from ../shared/data/h200-nvml-probe-2026-12-02.json",
            "ground_truth": probe["results"],
        },
    )
    n = 0
    with RecordingWriter(out, header) as w:
        for s in probe["samples"]:
            gpm = s.get("gpm") or {}
            dram = _finite(gpm.get("NVML_GPM_METRIC_DRAM_BW_UTIL"))
            void = dram is None

            def metric(name: str, scale: float, gpm: dict = gpm, void: bool = void) -> float | None:
                v = None if void else _finite(gpm.get(name))
                return v * scale if v is not None else None

            g = GpuSample(
                index=0,
                pcie_tx_Bps=metric("NVML_GPM_METRIC_PCIE_TX_PER_SEC", 1 << 20),
                pcie_rx_Bps=metric("NVML_GPM_METRIC_PCIE_RX_PER_SEC", 1 << 20),
                dram_bw_util=metric("NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
                mem_busy=s["util"][1] / 100.0,
                sm_util=metric("NVML_GPM_METRIC_SM_UTIL", 0.01),
            )
            w.write(Sample(t=s["t"], gpus=(g,), extra={"label": s["phase"]}))
            n += 1
    return n


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(convert(json.load(f), sys.argv[2]), "ticks")
