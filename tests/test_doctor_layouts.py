"""doctor on real slot layouts: fake sysfs trees (tests/fixtures/sysfs) + an explicit NVML stand-in."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from test_doctor_standin import Gpu, StandInLoad, StandInNvml, symmetric

from pcie_tui.core.errors import NoGpuError, UserError
from pcie_tui.doctor.run import run_doctor
from pcie_tui.doctor.topology import read_chain

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"
OK = pynvml.NVML_P2P_STATUS_OK
CNS = pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
NS = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
NVLINK_3_0 = pynvml.NVML_NVLINK_VERSION_3_0


def items(report, check, gpu=None):
    return [i for i in report["items"] if i["check"] == check and (gpu is None or i["gpu"] == gpu)]


def one(report, check, gpu=None):
    got = items(report, check, gpu)
    assert len(got) == 1, got
    return got[0]


def doctor(layout: str, nv: StandInNvml, load: bool = True, **kw):
    factory = (lambda: StandInLoad(nv)) if load else None
    return run_doctor(
        nvml=nv,
        sysfs_root=str(SYSFS / layout),
        proc_root=str(SYSFS / layout / "proc"),
        load_s=0.3,
        backend_factory=factory,
        **kw,
    )


def a6000_pair(gpu1_loaded=(4, 16)) -> StandInNvml:
    inactive = [(0, NVLINK_3_0, "00000000:00:00.0")] * 4
    gpus = [
        Gpu(
            "00000000:01:00.0",
            "NVIDIA RTX A6000",
            idle=(1, 16),
            loaded=(4, 16),
            max=(4, 16),
            gpu_max_gen=4,
            nvlinks=inactive,
        ),
        Gpu(
            "00000000:41:00.0",
            "NVIDIA RTX A6000",
            idle=(1, 16),
            loaded=gpu1_loaded,
            max=(4, 16),
            gpu_max_gen=4,
            nvlinks=inactive,
        ),
    ]
    return StandInNvml(gpus, p2p=symmetric({(0, 1): (OK, OK, NS)}), topo=symmetric({(0, 1): pynvml.NVML_TOPOLOGY_NODE}))


def test_x16x16_on_cpu_lanes_is_clean():
    r = doctor("x16x16-cpu", a6000_pair())
    assert r["ok"] and r["summary"]["fail"] == 0 and r["summary"]["warn"] == 0, [
        (i["check"], i["title"]) for i in r["items"] if i["status"] != "pass"
    ]
    assert r["load"]["how"] == "generated"
    for g in (0, 1):
        assert one(r, "chain", g)["title"].startswith("on CPU lanes: Gen4 x16")
        assert "under load" in one(r, "link", g)["title"]
    assert one(r, "p2p")["status"] == "pass"
    assert r["topology"]["matrix"] == [["X", "NODE"], ["NODE", "X"]]


def test_downtraining_under_load_fails_and_idle_only_warns():
    r = doctor("x16x16-cpu", a6000_pair(gpu1_loaded=(1, 16)))
    link1 = one(r, "link", 1)
    assert link1["status"] == "fail" and "downtrained under load" in link1["title"]
    assert "Gen1 x16 of max Gen4 x16" in link1["title"]
    assert one(r, "link", 0)["status"] == "pass"
    assert not r["ok"]
    # Without a load generator and nothing running, an idle Gen1 link is only suspicious.
    r = doctor("x16x16-cpu", a6000_pair(gpu1_loaded=(1, 16)), load=False)
    assert r["load"]["how"] == "idle"
    assert [one(r, "link", g)["status"] for g in (0, 1)] == ["warn", "warn"]
    assert "cannot judge" in one(r, "link", 0)["title"]


def test_x8x8_split_warns_about_width_and_missing_p2p():
    gpus = [
        Gpu(f"00000000:0{i}:00.0", "NVIDIA GeForce RTX 4090", idle=(1, 8), loaded=(4, 8), max=(4, 8), gpu_max_gen=4)
        for i in (1, 2)
    ]
    nv = StandInNvml(
        gpus, p2p=symmetric({(0, 1): (NS, NS, NS)}), topo=symmetric({(0, 1): pynvml.NVML_TOPOLOGY_HOSTBRIDGE})
    )
    r = doctor("x8x8-split", nv)
    for g in (0, 1):
        ch = one(r, "chain", g)
        assert ch["status"] == "warn"
        assert "Gen4 x8 for a Gen4 x16 card" in ch["title"]
        assert "a few percent" in ch["advice"]
        assert one(r, "link", g)["status"] == "pass"  # x8 is the link's max: trained fully
    p = one(r, "p2p")
    assert p["status"] == "warn" and "no P2P (not supported)" in p["title"]
    assert "host memory" in p["advice"]
    assert r["topology"]["matrix"][0][1] == "PHB"
    assert r["ok"]  # warnings only


def chipset_amd() -> StandInNvml:
    gpus = [
        Gpu("00000000:0A:00.0", "NVIDIA GeForce RTX 3090", idle=(1, 16), loaded=(4, 16), max=(4, 16), gpu_max_gen=4),
        Gpu("00000000:04:00.0", "NVIDIA GeForce RTX 3090", idle=(1, 4), loaded=(4, 4), max=(4, 4), gpu_max_gen=4),
    ]
    return StandInNvml(
        gpus, p2p=symmetric({(0, 1): (CNS, CNS, NS)}), topo=symmetric({(0, 1): pynvml.NVML_TOPOLOGY_HOSTBRIDGE})
    )


def test_chipset_x4_is_called_out_with_its_tensor_parallel_cost():
    r = doctor("chipset-x4-amd", chipset_amd())
    assert not r["ok"]
    ch = one(r, "chain", 1)
    assert ch["status"] == "fail" and "behind the chipset" in ch["title"]
    assert "shared with 3 other device(s)" in ch["title"]
    ev = " ".join(ch["evidence"])
    assert "AMD chipset" in ev and "NVMe" in ev and "USB" in ev and "SATA" in ev
    # Tensor-parallel cost from the link model: 2.6 MB/token for 70B TP=2 bf16, prefill x4 vs x16 = 4x.
    cost = ch["data"]["tp_cost"]
    assert cost["here"]["tp_bytes_per_token"] == pytest.approx(2 * 80 * 2 * 0.5 * 8192 * 2)
    assert cost["here"]["prefill"]["bandwidth_time_s"] / cost["better"]["prefill"]["bandwidth_time_s"] == pytest.approx(
        4.0
    )
    assert "2.6 MB per token" in ev and "slowest link" in ev
    assert "CPU-attached slot" in ch["advice"]
    assert one(r, "chain", 0)["status"] == "pass"
    p = one(r, "p2p")
    assert p["status"] == "fail" and "chipset not supported" in p["title"]


def test_chipset_x4_intel_pch():
    gpus = [
        Gpu("00000000:01:00.0", "NVIDIA GeForce RTX 4090", idle=(1, 16), loaded=(4, 16), max=(4, 16), gpu_max_gen=4),
        Gpu("00000000:03:00.0", "NVIDIA GeForce RTX 4090", idle=(1, 4), loaded=(4, 4), max=(4, 4), gpu_max_gen=4),
    ]
    nv = StandInNvml(
        gpus, p2p=symmetric({(0, 1): (NS, NS, NS)}), topo=symmetric({(0, 1): pynvml.NVML_TOPOLOGY_HOSTBRIDGE})
    )
    r = doctor("chipset-x4-intel", nv)
    ch = one(r, "chain", 1)
    assert ch["status"] == "fail"
    ev = " ".join(ch["evidence"])
    assert "Intel PCH port" in ev and "DMI" in ev
    assert {s["bdf"] for s in ch["data"]["sharers"]} == {"0000:00:14.0", "0000:00:17.0", "0000:02:00.0", "0000:00:1f.0"}
    assert one(r, "chain", 0)["status"] == "pass"


def test_gpu_behind_a_pcie_switch():
    gpus = [
        Gpu(f"00000000:{b}:00.0", "NVIDIA A100 80GB PCIe", idle=(4, 16), loaded=(4, 16), max=(4, 16), gpu_max_gen=4)
        for b in ("18", "19")
    ]
    nv = StandInNvml(gpus, p2p=symmetric({(0, 1): (OK, OK, NS)}), topo=symmetric({(0, 1): pynvml.NVML_TOPOLOGY_SINGLE}))
    r = doctor("switch", nv)
    assert r["ok"] and r["summary"]["warn"] == 0
    ch = one(r, "chain", 0)
    assert ch["data"]["attach"] == "switch"
    assert "behind a PCIe switch" in ch["title"] and "shared with 1 other GPU" in ch["title"]
    assert [h["role"] for h in ch["data"]["hops"]] == [
        "root port -> switch upstream port",
        "switch downstream port -> device",
    ]
    assert r["topology"]["matrix"] == [["X", "PIX"], ["PIX", "X"]]


def test_gen5_x8_card_in_a_narrow_slot():
    nv = StandInNvml(
        [Gpu("00000000:01:00.0", "NVIDIA GeForce RTX 5090", idle=(1, 8), loaded=(5, 8), max=(5, 8), gpu_max_gen=5)]
    )
    r = doctor("gen5-x8", nv)
    ch = one(r, "chain", 0)
    assert ch["status"] == "warn" and "Gen5 x8 for a Gen5 x16 card (31.5 GB/s per direction)" in ch["title"]
    assert one(r, "link", 0)["status"] == "pass"
    assert one(r, "p2p")["title"] == "single GPU: no peers"


def test_nvlink_bridge_pair():
    def links(peer):
        return [(1, NVLINK_3_0, peer)] * 4

    gpus = [
        Gpu(
            "00000000:0A:00.0",
            "NVIDIA GeForce RTX 3090",
            idle=(1, 8),
            loaded=(4, 8),
            max=(4, 8),
            gpu_max_gen=4,
            nvlinks=links("00000000:0B:00.0"),
        ),
        Gpu(
            "00000000:0B:00.0",
            "NVIDIA GeForce RTX 3090",
            idle=(1, 8),
            loaded=(4, 8),
            max=(4, 8),
            gpu_max_gen=4,
            nvlinks=links("00000000:0A:00.0"),
        ),
    ]
    nv = StandInNvml(
        gpus, p2p=symmetric({(0, 1): (OK, OK, OK)}), topo=symmetric({(0, 1): pynvml.NVML_TOPOLOGY_HOSTBRIDGE})
    )
    r = doctor("nvlink-pair", nv)
    assert r["topology"]["matrix"] == [["X", "NV4"], ["NV4", "X"]]
    p = one(r, "p2p")
    assert p["status"] == "pass" and "over NVLink" in p["title"]
    nl = one(r, "nvlink", 0)
    assert nl["title"] == "4 NVLink(s) active" and "version 3.0" in nl["evidence"][0]
    assert "n/a" in nl["evidence"][1]  # speed field not answered: shown as n/a, never 0
    # A half-seated bridge: two of four links down.
    gpus[0].nvlinks = links("00000000:0B:00.0")[:2] + [(0, NVLINK_3_0, "00000000:0B:00.0")] * 2
    r = doctor("nvlink-pair", nv)
    assert one(r, "nvlink", 0)["status"] == "warn"
    assert r["topology"]["matrix"][0][1] == "NV2"


def numa_pair(pids_on_gpu1=(4242,)) -> StandInNvml:
    gpus = [
        Gpu(
            "00000000:01:00.0",
            "NVIDIA H100 PCIe",
            idle=(5, 16),
            loaded=(5, 16),
            max=(5, 16),
            gpu_max_gen=5,
            affinity=[0xFFFFFFFF],
        ),
        Gpu(
            "00000000:81:00.0",
            "NVIDIA H100 PCIe",
            idle=(5, 16),
            loaded=(5, 16),
            max=(5, 16),
            gpu_max_gen=5,
            affinity=[0xFFFFFFFF << 32],
            pids=list(pids_on_gpu1),
        ),
    ]
    return StandInNvml(
        gpus, p2p=symmetric({(0, 1): (OK, OK, NS)}), topo=symmetric({(0, 1): pynvml.NVML_TOPOLOGY_SYSTEM})
    )


def test_numa_mismatch_of_the_engine():
    r = doctor("numa-2socket", numa_pair())
    n1 = one(r, "numa", 1)
    assert n1["status"] == "fail" and "NUMA mismatch" in n1["title"]
    assert "sysfs numa_node" in n1["evidence"][0]  # NVML NUMA id unsupported: fell back to sysfs
    assert "NVML ideal CPU affinity: 32-63" in n1["evidence"][1]
    assert "numactl --cpunodebind=1 --membind=1" in n1["advice"]
    assert n1["data"]["processes"][0]["pages_per_node"] == {0: 812 + 262144}
    assert one(r, "numa", 0)["status"] == "pass"  # nothing runs on GPU0
    assert r["topology"]["matrix"][0][1] == "SYS"
    # --pid given explicitly: same verdict.
    r = doctor("numa-2socket", numa_pair(pids_on_gpu1=()), pid=4242)
    assert one(r, "numa", 1)["status"] == "fail"
    assert one(r, "numa", 0)["status"] == "pass"


def test_bad_pid_is_a_user_error():
    with pytest.raises(UserError, match="no process 999"):
        doctor("numa-2socket", numa_pair(), pid=999)


def test_no_gpu_is_one_clear_error():
    class NoDriver:
        NVMLError = pynvml.NVMLError

        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with pytest.raises(NoGpuError, match="no NVIDIA GPU reachable"):
        run_doctor(nvml=NoDriver(), sysfs_root=str(SYSFS / "gen5-x8"))
    empty = StandInNvml([])
    with pytest.raises(NoGpuError, match="found no GPU"):
        run_doctor(nvml=empty, sysfs_root=str(SYSFS / "gen5-x8"))


def test_chain_reads_real_kernel_paths():
    c = read_chain(SYSFS / "chipset-x4-amd", "00000000:04:00.0")
    assert [n.bdf for n in c.nodes] == ["0000:00:01.2", "0000:02:00.0", "0000:03:01.0", "0000:04:00.0"]
    assert c.narrowest is not None and c.narrowest.label() == "0000:00:01.2 -> 0000:02:00.0"
    assert (c.narrowest.max_gen, c.narrowest.max_width) == (4, 4)
    assert read_chain(SYSFS / "chipset-x4-amd", "0000:99:00.0").found is False
