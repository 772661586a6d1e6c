"""``report --plot``: the timeline figure of a recording."""
