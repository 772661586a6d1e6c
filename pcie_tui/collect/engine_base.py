"""What every inference-engine client offers to the engine poller."""

from __future__ import annotations

from typing import Any, Protocol

from pcie_tui.model import EngineSample


class EngineClient(Protocol):
    kind: str  # "vllm" | "llamacpp"

    def describe(self) -> dict[str, Any]:
        """Static facts for the recording header's ``engine`` object.

        At least: kind, url, pid, cmdline (argv list), layout (parsed split/parallel
        flags), version, gpus (NVML indices the process tree holds, if known).
        """
        ...

    def read(self) -> EngineSample:
        """One scrape with short timeouts. Never raises: failures give up=False and error."""
        ...
