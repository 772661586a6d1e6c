"""Convert the raw H200 NVML probe (../shared/data) into a pcie-tui recording.

The probe sampled every ~50 ms, below GPM's 100 ms minimum window, so about
half its GPM readings are NaN or 0; those become null here. PCIe rates come
from nvmlDeviceGetPcieThroughput (KB/s, x1024), which the probe read every tick.
Each tick keeps the probe's phase label as ``label``.

usage: python scripts/convert_probe.py PROBE.json OUT.jsonl[.gz]
"""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone

from pcie_tui.model import GpuInfo, GpuSample, LinkInfo, Sample, SessionHeader, pcie_capacity_Bps
from pcie_tui.record.writer import RecordingWriter


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
            sm = _finite(gpm.get("NVML_GPM_METRIC_SM_UTIL"))
            g = GpuSample(
                index=0,
                pcie_tx_Bps=s["tx"] * 1024.0,
                pcie_rx_Bps=s["rx"] * 1024.0,
                dram_bw_util=dram / 100.0 if dram is not None else None,
                mem_busy=s["util"][1] / 100.0,
                sm_util=sm / 100.0 if sm is not None else None,
            )
            w.write(Sample(t=s["t"], gpus=(g,), extra={"label": s["phase"]}))
            n += 1
    return n


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(convert(json.load(f), sys.argv[2]), "ticks")
