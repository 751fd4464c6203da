"""An example handler for a deployment: ``--handler streamq.example:handle``.

It accepts JSON objects, strings or bytes and returns a small JSON summary,
so a new deployment can be checked end to end before a real handler is
installed in the image.
"""

from __future__ import annotations

import hashlib
from typing import Any


def handle(payload: Any) -> dict[str, Any]:
    """Return a digest and the size of the payload."""
    raw = payload if isinstance(payload, bytes) else repr(payload).encode()
    return {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}
