"""argparse wiring for ``doctor``, ``calibrate`` and ``linkmodel``.

``register(subparsers)`` adds the three subcommands; each sets ``func`` to a
handler ``(args) -> int`` (calibrate's lives in :mod:`pcie_tui.doctor.calibrate`). Handlers raise UserError / NoGpuError for bad input
or a missing GPU; the main CLI prints that as one line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pcie_tui.core.errors import NoGpuError, UserError
from pcie_tui.core.model import PCIE_LANE_Bps, pcie_capacity_Bps
from pcie_tui.doctor.calibrate import add_calibration_items, calibrate_main
from pcie_tui.doctor.render import print_json


def _number(kind: type, minimum: float, inclusive: bool) -> Any:
    """argparse type: a number of ``kind`` above (or at, when inclusive) ``minimum``; one-line error otherwise."""

    def conv(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if v != v or v < minimum or (v == minimum and not inclusive):  # NaN too
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {minimum:g}, not {text!r}")
        return v

    conv.__name__ = f"{kind.__name__}"
    return conv


positive_int = _number(int, 0, inclusive=False)
positive_float = _number(float, 0, inclusive=False)
nonneg_int = _number(int, 0, inclusive=True)
nonneg_float = _number(float, 0, inclusive=True)


def register(subparsers: Any) -> None:
    """Add the ``doctor``, ``calibrate`` and ``linkmodel`` subcommands."""
    _register_doctor(subparsers)
    _register_calibrate(subparsers)
    _register_linkmodel(subparsers)


def _register_doctor(subparsers: Any) -> None:
    """``doctor``: the checks, or with --since what changed since a baseline."""
    p = subparsers.add_parser("doctor", help="check slot wiring, link training, NUMA placement, P2P and PCIe errors")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--pid",
        type=positive_int,
        metavar="PID",
        help="check this process's CPU/memory placement against the GPUs' NUMA nodes",
    )
    p.add_argument(
        "--load-s",
        type=nonneg_float,
        default=3.0,
        metavar="S",
        help="seconds of generated copy load to judge links under (default 3; 0: none)",
    )
    p.add_argument("--sysfs-root", default="/sys", metavar="DIR", help="sysfs mount to read (default /sys)")
    p.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    p.add_argument(
        "--save-baseline",
        nargs="?",
        const="",
        metavar="DIR",
        help="also write this machine's fingerprint as baseline-<host>-<UTC time>.json into DIR "
        "(default: beside the calibration, $XDG_CONFIG_HOME/pcie-tui)",
    )
    p.add_argument(
        "--since",
        metavar="BASELINE",
        help="say what changed since this baseline (file, or a folder: its newest) and whether a retest "
        "is due (exit 1), instead of the checks",
    )
    p.add_argument("--now", metavar="FILE", help="with --since: compare with this baseline instead of the machine now")
    p.add_argument(
        "--recording", metavar="FILE", help="take the engine layout for the baseline from this recording's header"
    )
    p.set_defaults(func=doctor_main)


def _register_calibrate(subparsers: Any) -> None:
    """``calibrate``: time host<->GPU copies and store them as link ceilings."""
    c = subparsers.add_parser(
        "calibrate", help="measure achievable host<->GPU copy rates and store them as link ceilings"
    )
    c.add_argument("--gpu", type=nonneg_int, metavar="INDEX", help="only this GPU (NVML index)")
    c.add_argument("--size-mib", type=positive_int, default=256, metavar="MIB", help="copy size in MiB (default 256)")
    c.add_argument(
        "--seconds", type=positive_float, default=1.5, metavar="S", help="seconds of copies per direction (default 1.5)"
    )
    c.add_argument(
        "--backend", choices=("torch", "cuda-python"), help="copy backend (default: torch, else cuda-python)"
    )
    c.add_argument("--no-save", action="store_true", help="measure only; do not store the result")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    c.add_argument("--sysfs-root", default="/sys", help=argparse.SUPPRESS)
    c.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    c.set_defaults(func=calibrate_main)


def _register_linkmodel(subparsers: Any) -> None:
    """``linkmodel``: predict tensor/pipeline-parallel link traffic per token (and compare with a recording)."""
    m = subparsers.add_parser("linkmodel", help="predict tensor/pipeline-parallel link traffic per token")
    src = m.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="DIR", help="vLLM/HF model directory (reads config.json)")
    src.add_argument("--gguf", metavar="FILE", help="GGUF model file (reads its metadata)")
    m.add_argument("--hidden", type=positive_int, metavar="N", help="hidden size (overrides the config)")
    m.add_argument("--layers", type=positive_int, metavar="N", help="number of layers (overrides the config)")
    m.add_argument(
        "--dtype-bytes",
        type=positive_int,
        metavar="B",
        help="bytes per activation element on the wire (bf16 2, f32 4; default: the config's, GGUF 4, flags 2)",
    )
    m.add_argument(
        "--tp", type=positive_int, default=1, metavar="N", help="tensor-parallel GPUs (default 1: no all-reduces)"
    )
    m.add_argument(
        "--pp", type=positive_int, default=1, metavar="N", help="pipeline-parallel stages (default 1: no hand-offs)"
    )
    m.add_argument(
        "--batch", type=positive_int, default=1, metavar="N", help="sequences decoded together per step (default 1)"
    )
    m.add_argument(
        "--prompt-tokens", type=positive_int, default=2048, metavar="N", help="tokens per prefill step (default 2048)"
    )
    m.add_argument(
        "--link",
        type=_link_arg,
        default="4x16",
        metavar="GENxWIDTH",
        help="link to price, e.g. 4x16, 5x8: Gen 1-6, width x1/2/4/8/12/16/32 (default 4x16)",
    )
    m.add_argument(
        "--ceiling-gbps",
        type=positive_float,
        metavar="GB/S",
        help="link ceiling in GB/s per direction (overrides --link)",
    )
    m.add_argument(
        "--latency-us",
        type=nonneg_float,
        default=25.0,
        metavar="US",
        help="fixed latency per all-reduce in us (default 25, PCIe; 0 prices bandwidth only)",
    )
    m.add_argument(
        "--recording", metavar="FILE", help="compare with the traffic measured in this recording (or a bundled demo)"
    )
    m.add_argument("--json", action="store_true", help="print the prediction (and comparison) as JSON")
    m.set_defaults(func=linkmodel_main)


def doctor_main(args: argparse.Namespace, nvml: Any = None) -> int:
    from pcie_tui.doctor.render import render_doctor
    from pcie_tui.doctor.run import run_doctor

    if args.load_s < 0:
        raise UserError("--load-s must be >= 0")
    if args.pid is not None and args.pid < 1:
        raise UserError(f"--pid must be a process id >= 1, not {args.pid}")
    since, now, save = getattr(args, "since", None), getattr(args, "now", None), getattr(args, "save_baseline", None)
    if now and not since:
        raise UserError("--now FILE needs --since BASELINE")
    if since and save is not None:
        raise UserError("--since and --save-baseline do not go together: compare first, save after the retest")
    if since:
        from pcie_tui.doctor.retest import since_main

        return since_main(args, nvml)
    try:
        report = run_doctor(
            nvml=nvml, sysfs_root=args.sysfs_root, proc_root=args.proc_root, pid=args.pid, load_s=args.load_s
        )
    except NoGpuError as e:
        if save is not None:  # the baseline still records the host, and why there are no GPU facts
            from pcie_tui.doctor import fingerprint as fpm

            fp = fpm.no_gpu(str(e), fpm.host_facts(args.proc_root), _baseline_engine(args), "doctor")
            path = fpm.write(fp, save or None)
            print(
                f"baseline saved to {path} (host facts, and gpu_error saying why there are no GPU facts)",
                file=sys.stderr,
            )
        raise
    add_calibration_items(report)
    if args.proc_root == "/proc":  # a captured /proc (tests, a copied host) holds no live engines to list
        from pcie_tui.doctor.untested import add_untested_engine_items

        add_untested_engine_items(report)
    if save is not None:
        report["baseline"] = str(_save_doctor_baseline(args, report, save or None))
    if args.json:
        print_json(report)
    else:
        print(render_doctor(report))
        if save is not None:
            print(f"baseline saved to {report['baseline']}")
    return 0 if report["ok"] else 1


def _save_doctor_baseline(args: argparse.Namespace, report: dict[str, Any], directory: str | None) -> Any:
    from pcie_tui.doctor import fingerprint as fpm

    host = fpm.host_facts(args.proc_root, report.get("driver_version"))
    return fpm.write(fpm.from_report(report, host, _baseline_engine(args), "doctor"), directory)


def _baseline_engine(args: argparse.Namespace) -> dict[str, Any] | None:
    """The engine facts a baseline records: from ``--recording``'s header, else the ``--pid`` process."""
    from pcie_tui.doctor import fingerprint as fpm

    engine = fpm.engine_from_recording(args.recording) if getattr(args, "recording", None) else None
    if engine is None and args.pid is not None:
        engine = fpm.engine_from_pid(args.pid)
    return engine


PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)  # the link widths the PCIe specification defines


def _link_problem(text: str) -> tuple[int, int] | str:
    """(gen, width) of ``GENxWIDTH`` (``4x16``, ``gen5x8``), or what is wrong with it."""
    try:
        gen_s, width_s = text.lower().replace("gen", "").split("x")
        gen, width = int(gen_s), int(width_s)
    except ValueError:
        return f"wants GENxWIDTH like 4x16 or 5x8, not {text!r}"
    gens = sorted(PCIE_LANE_Bps)
    if gen not in PCIE_LANE_Bps:
        return f"{text!r}: there is no PCIe Gen{gen} (generations {gens[0]} to {gens[-1]})"
    if width not in PCIE_WIDTHS:
        return f"{text!r}: x{width} is not a PCIe link width ({', '.join(f'x{w}' for w in PCIE_WIDTHS)})"
    return gen, width


def parse_link(text: str) -> tuple[int, int]:
    """``--link`` as (gen, width); UserError naming the flag otherwise (direct calls skip argparse's type)."""
    got = _link_problem(text)
    if isinstance(got, str):
        raise UserError(f"--link {got}")
    return got


def _link_arg(text: str) -> str:
    """argparse type for ``--link``: checked at parse time (argparse names the flag), kept as text."""
    got = _link_problem(text)
    if isinstance(got, str):
        raise argparse.ArgumentTypeError(got)
    return text


def linkmodel_main(args: argparse.Namespace) -> int:
    from pcie_tui.analyze import linkmodel as lm

    if args.model:
        shape = lm.from_hf_config(args.model, args.dtype_bytes)
    elif args.gguf:
        shape = lm.from_gguf(args.gguf, 4 if args.dtype_bytes is None else args.dtype_bytes)
    else:
        if args.hidden is None or args.layers is None:
            raise UserError("give --model DIR, --gguf FILE, or --hidden and --layers")
        shape = lm.ModelShape(args.hidden, args.layers, 2 if args.dtype_bytes is None else args.dtype_bytes)
    # Direct calls (tests, other front ends) skip argparse's types: check again, naming the flag.
    for name in ("hidden", "layers", "dtype_bytes", "tp", "pp", "batch", "prompt_tokens"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, not {v}")
    if args.latency_us is not None and args.latency_us < 0:
        raise UserError(f"--latency-us must be >= 0, not {args.latency_us:g}")
    if args.ceiling_gbps is not None and args.ceiling_gbps <= 0:
        raise UserError(f"--ceiling-gbps must be > 0, not {args.ceiling_gbps:g}")
    shape = lm.ModelShape(
        shape.hidden_size if args.hidden is None else args.hidden,
        shape.num_layers if args.layers is None else args.layers,
        shape.dtype_bytes if args.dtype_bytes is None else args.dtype_bytes,
        shape.name,
        shape.source,
    )
    if args.ceiling_gbps is not None:
        ceiling, label = args.ceiling_gbps * 1e9, "given"
    else:
        gen, width = parse_link(args.link)
        ceiling, label = float(pcie_capacity_Bps(gen, width) or 0.0), f"Gen{gen} x{width} theoretical"
    layout = lm.Layout(args.tp, args.pp, args.batch, args.prompt_tokens)
    pred = lm.predict(shape, layout, ceiling, args.latency_us * 1e-6)
    pred["ceiling_label"] = label
    if args.recording:
        from pcie_tui.recording.demos import recording_path
        from pcie_tui.recording.reader import read_recording

        rec = read_recording(recording_path(args.recording)[0])  # a file or a bundled demo's name
        lm.compare_with_recording(pred, layout, rec.header, rec.samples)
    if args.json:
        print_json(pred)
    else:
        print(render_linkmodel(pred))
    return 0


def render_linkmodel(p: dict[str, Any]) -> str:
    """``linkmodel``'s text, and the report's "Link budget model" (which adds ``source`` and ``host_weights``)."""
    lines = _model_lines(p) + _traffic_lines(p)
    measured = p.get("measured") or {}
    comparison = p.get("comparison") or {}
    if "measured" in p and p.get("comparison_reason"):
        lines.append(f"recording: no comparison: {p['comparison_reason']}")
    elif "measured" in p:
        for ph in ("prefill", "decode"):
            if ph not in comparison:
                lines.append(f"recording {ph}: no comparison: the recording has no {ph} ticks")
    for ph, rows in comparison.items():
        for idx, r in rows.items():
            lines.append(_comparison_line(p, ph, idx, r, measured.get(ph) or {}))
    return "\n".join(lines)


def _model_lines(p: dict[str, Any]) -> list[str]:
    from pcie_tui.analyze.linkmodel import count
    from pcie_tui.core.units import rate_sig as fmt_rate

    m, lay = p["model"], p["layout"]
    if p.get("model_file_reason"):  # the report, from the recording's header: say so, and why not the file
        first = f"{p['source']}, {m['dtype_bytes']} B/activation; the model file was not read: {p['model_file_reason']}"
    else:
        first = (
            f"{m['name']}: hidden {m['hidden_size']}, {count(m['num_layers'], 'layer')}, "
            f"{m['dtype_bytes']} B/activation ({m['source']})"
        )
    return [
        first,
        f"layout TP={lay['tp']} PP={lay['pp']}, decode batch {lay['batch']}, prompt {count(lay['prompt_tokens'], 'token')}; "
        f"link {p['ceiling_label']} = {fmt_rate(p['ceiling_Bps'])} per direction",
    ]


def _traffic_lines(p: dict[str, Any]) -> list[str]:
    """Inter-GPU bytes per token, the host weights' bytes per micro-batch, and each phase's link time."""
    from pcie_tui.analyze.linkmodel import count
    from pcie_tui.core.units import size as fmt_bytes

    lay, host = p["layout"], p.get("host_weights")
    lines = []
    if p["tp_bytes_per_token"] <= 0 and p["pp_bytes_per_token"] <= 0:
        lines.append(
            f"TP={lay['tp']} and PP={lay['pp']}: one GPU holds the whole model, so there is no inter-GPU traffic per token"
            + (
                ""
                if "host_weights" in p
                else " (give --tp or --pp > 1 to price a split model; host<->GPU copies are not modelled)"
            )
        )
    else:
        lines.append(
            f"per token per GPU: TP all-reduce {fmt_bytes(p['tp_bytes_per_token'])} each way, "
            f"PP hand-off {fmt_bytes(p['pp_bytes_per_token'])} per stage boundary; "
            f"{count(round(p['allreduces_per_step']), 'all-reduce')} per step at {p['allreduce_latency_s'] * 1e6:g} us"
        )
    if "host_weights" in p:
        lines.append(_host_line(host))
        lines += [f"  {n}" for n in (host or {}).get("notes") or ()]
    for ph in ("prefill", "decode"):
        r = p[ph]
        if r["bytes_per_step"] <= 0 and r["latency_floor_s"] <= 0:
            continue
        head = f"{ph:>7}: {fmt_bytes(r['bytes_per_step'])} per step ({count(r['tokens_per_step'], 'token')}) -> "
        if r["latency_floor_s"] <= 0:  # no all-reduces: the wire time is the link time
            lines.append(head + f"{_ms(r['bandwidth_time_s'])} on the wire")
            continue
        lines.append(
            head + f"{_ms(r['bandwidth_time_s'])} on the wire + {_ms(r['latency_floor_s'])} latency floor"
            f" = {_ms(r['link_time_s'])} ({'latency' if r['latency_bound'] else 'bandwidth'}-bound)"
        )
    return lines


def _host_line(host: dict[str, Any] | None) -> str:
    """The engine's host weights over the link: what, how often, the arithmetic and its bytes."""
    from pcie_tui.core.units import size as fmt_bytes

    if host is None:
        return "host weights: not modelled for this engine (host<->GPU copies are not priced)"
    if not host.get("what"):
        return "host weights: none (every weight is in GPU memory): no weight crosses the link per token"
    b, ub = host.get("bytes_per_microbatch"), host.get("ubatch")
    if not b:
        return f"host weights: {host['what']}; prefill copies none of them: {host.get('arithmetic')}"
    return (
        f"host weights: {host['what']} cross the link once per prefill micro-batch of {ub} tokens "
        f"({host.get('ubatch_source')}): {host.get('arithmetic')} = {fmt_bytes(b)} per micro-batch, "
        f"{fmt_bytes(host.get('prefill_bytes_per_token'))} per prompt token"
    )


def _comparison_line(p: dict[str, Any], ph: str, idx: Any, r: dict[str, Any], mph: dict[str, Any]) -> str:
    from pcie_tui.analyze.linkmodel import count
    from pcie_tui.core.units import size as fmt_bytes

    mb, head = r["measured_bytes_per_token"], f"recording {ph} GPU{idx}"
    if mb is None:
        return f"{head}: bytes per token n/a ({r.get('tokens_reason') or 'no token counts'})"
    if r["predicted_bytes_per_token"] > 0:
        return (
            f"{head}: measured {fmt_bytes(mb)}/token vs predicted {fmt_bytes(r['predicted_bytes_per_token'])}/token"
            + (f" (x{r['ratio']:.2f})" if r["ratio"] else "")
        )
    why = "host<->GPU traffic: the model predicts none between GPUs"
    if "host_weights" in p:
        why = f"host<->GPU traffic the budget does not price: no weight crosses in {ph}"
    return f"{head}: measured {fmt_bytes(mb)}/token over {count(mph.get('tokens') or 0, 'token')} ({why})"


def _ms(s: float) -> str:
    """A duration with 3 significant digits and no exponent: 83.2 us, 4.08 ms, 174 ms, 21600 s."""
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3 or s == 0:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"
