"""The command line: argument parsing and opening sources."""
