"""NVML's clock-event (throttle) reasons: the bitmask of ``nvmlDeviceGetCurrentClocksEventReasons``, by name.

The bit values are nvml.h's ``nvmlClocksEventReason*`` (the same as the older ``...ThrottleReason*``).
Three reasons are not throttling: an idle GPU, clocks set by the application or the display. The
others cut the clocks of a busy GPU: :data:`THROTTLE_BITS`.
"""

from __future__ import annotations

# bit -> (short name as the report prints it, what it means in plain words)
REASONS: dict[int, tuple[str, str]] = {
    0x1: ("idle", "nothing runs: clocks drop to save power"),
    0x2: ("app clocks", "application clock setting (nvidia-smi -ac or an API call)"),
    0x4: ("power cap", "SW power cap: the board draws at its enforced power limit"),
    0x8: ("HW slowdown", "HW slowdown: thermal or power-supply alarm (clocks halved or more)"),
    0x10: ("sync boost", "sync boost: held to the clock of the slowest GPU of its group"),
    0x20: ("SW thermal", "SW thermal slowdown: the GPU or its memory is past its temperature target"),
    0x40: ("HW thermal", "HW thermal slowdown: past the hardware temperature limit"),
    0x80: ("power brake", "HW power brake: an external power-brake signal (the chassis or PSU)"),
    0x100: ("display clocks", "display clock setting"),
}
NOT_THROTTLE = 0x1 | 0x2 | 0x100
THROTTLE_BITS = sum(REASONS) & ~NOT_THROTTLE


def names(mask: int | None) -> list[str]:
    """The short names of the reasons set in ``mask`` (bits NVML may add later as ``bit 0x...``)."""
    if mask is None:
        return []
    out = [name for bit, (name, _) in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    bit = 1
    while rest:
        if rest & bit:
            out.append(f"bit {bit:#x}")
            rest &= ~bit
        bit <<= 1
    return out


def throttling(mask: int | None) -> int:
    """The bits of ``mask`` that cut clocks (0 for None, idle or app/display settings)."""
    return (mask or 0) & ~NOT_THROTTLE


def label(mask: int | None) -> str:
    """The throttling reasons in words, joined by '+' ('' when none)."""
    return "+".join(names(throttling(mask)))
