"""Per-request msprobe dumps ("lanes"), used by both the rollout and the training hooks.

The way in is ``msprobe_lanes`` (``packed_lanes``, ``install``, ``uninstall``): nothing outside
this room imports the others, which are its parts: ``lane_collector`` (every lane in one pass),
``lane_stats`` (the lanes' statistics on the device), ``lane_json`` (each lane's ``dump.json``
text), ``call_stack`` (msprobe's stack capture, remembered per call stack),
``msprobe_shortcuts`` (msprobe's per-tensor host questions, answered the same way with less Python)
and ``lane_writer`` (a dumped step's files rendered and written by a helper process; its
``LaneWriter`` is handed out by the way in).
Nothing here imports torch or msprobe at import time.
"""
