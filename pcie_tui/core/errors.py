"""Errors that the CLI turns into one clear line and a non-zero exit."""


class UserError(Exception):
    """Bad input or a missing prerequisite; the message is shown to the user as is."""

    exit_code = 2


class NoGpuError(UserError):
    """NVML or the GPU is missing."""

    exit_code = 3


class OutputError(UserError):
    """The recording could not be written on (disk full, the file removed or made unwritable mid-run): what
    was written before is kept; the message says how much and why."""

    exit_code = 4
