"""The only caller of streamq's Lua: one typed method per script.

Scripts are assembled by :mod:`streamq.luaload` into one functions library,
run with FCALL (:mod:`streamq.script_base`), called with the key names of
:mod:`streamq.keys`, and their replies parsed into plain tuples here.
Negative integer replies are streamq's error codes, mapped to exceptions in
:func:`raise_for_code`.
"""


from __future__ import annotations

from streamq.base.replies import (
    AckReply,
    Call,
    CreateReply,
    JobMeta,
    JobReply,
    PromoteReply,
    ScriptErrorCode,
    SettleReply,
    new_token,
    raise_for_code,
)
from streamq.model.dead_scripts import DeadLetterScripts
from streamq.model.job_scripts import JobScripts
from streamq.model.lane_scripts import LaneCtx, LaneScripts
from streamq.model.queue_scripts import QueueScripts

__all__ = [
    "AckReply", "Call", "LaneCtx", "CreateReply", "JobMeta", "JobReply", "PromoteReply", "ScriptErrorCode",
    "Scripts", "SettleReply", "new_token", "raise_for_code",
]


class Scripts(JobScripts, QueueScripts, DeadLetterScripts, LaneScripts):
    """Every Lua entry point of streamq, bound to one Redis client."""
