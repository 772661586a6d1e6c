"""The one vocabulary: the bound and saturation-verdict names and the words every surface prints.

Base layer: imports nothing. The report, the TUI, the exporter's labels and the plot take their
words from here; docs/attribution.md explains them. A link at its ceiling is "link-saturated",
the one word for it on every surface (tests/test_vocabulary.py keeps the old one out).
"""

from __future__ import annotations

# What held a tick, a phase or a session back, in the attribution's order of precedence on display.
# "unknown": a tick of work whose bound needs a counter the GPU did not report (or a headline with
# no GPU readings at all); the per-tick codes are TICK_BOUNDS.
BOUNDS = ("link", "transfer", "host", "memory", "compute", "idle", "unknown")
TICK_BOUNDS = BOUNDS  # a tick whose bound needs a counter it lacks is unknown

# The full words, as a sentence says them.
BOUND_WORDS = {
    "link": "link-saturated",
    "transfer": "transfer-bound below link capacity",
    "host": "host-bound",
    "memory": "memory-bound",
    "compute": "compute-bound",
    "idle": "idle",
    "unknown": "unknown",
}

# The words for a table cell (the report's "held back by" column).
BOUND_SHORT = {**BOUND_WORDS, "transfer": "transfer-bound"}

# The saturation verdict of a tick (analyze.verdict): which resource is at its ceiling, if any.
VERDICTS = ("link", "memory", "compute", "none")
VERDICT_WORDS = {
    "link": "link-saturated",
    "memory": "memory-bound",
    "compute": "compute-bound",
    "none": "nothing saturated",
}
