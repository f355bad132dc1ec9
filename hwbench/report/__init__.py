"""Turning results into tables people read.

``hwbench.report(...)`` is also the Python API's report function (hwbench.api.report). Once this
package is imported, Python binds the name ``hwbench.report`` to it, over that function; so the
package answers a call the same way, and ``hwbench.report(...)`` works every time, not only the
first."""

import sys
import types


class _ReportPackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        api_report = sys.modules["hwbench"].__getattr__("report")  # hwbench's lazy entry to hwbench.api
        return api_report(*args, **kwargs)


sys.modules[__name__].__class__ = _ReportPackage
