"""Float options of the command line refuse NaN and infinity as bad input."""

from __future__ import annotations

import copy
import math
from typing import Any

#: a float type of click's, by its class, made to refuse NaN and infinity
_FINITE: dict[type, type] = {}


def finite(p: Any) -> None:
    """Make float option ``p`` refuse NaN and infinity as bad input: click's ranges take
    NaN (no comparison with it is true) and a bound on one side takes infinity."""
    base = type(p.type)
    if base.__name__ not in ("FloatParamType", "FloatRange"):
        return  # not a float, or refusing already

    def convert(self: Any, value: Any, param: Any, ctx: Any) -> Any:
        rv = base.convert(self, value, param, ctx)
        if isinstance(rv, float) and not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv

    refusing = _FINITE.setdefault(base, type(f"Finite{base.__name__}", (base,),
                                             {"convert": convert}))
    p.type = copy.copy(p.type)  # click's FLOAT is one object, shared
    p.type.__class__ = refusing
