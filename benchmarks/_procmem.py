"""Process memory on Linux, read from ``/proc/self`` (no torch import, so a script can use it before re-executing).

- :func:`status_kib`: a field of ``/proc/self/status`` in KiB (``VmRSS`` = resident now, ``VmHWM`` = peak resident).
- :func:`reset_peak_rss`: reset ``VmHWM`` to the current RSS by writing ``5`` to ``/proc/self/clear_refs``
  (Linux ≥ 4.0), so that ``status_kib("VmHWM") - status_kib("VmRSS")`` read around a piece of work is its peak.
"""

from __future__ import annotations


def status_kib(field: str) -> int:
    """``field`` of ``/proc/self/status`` in KiB; 0 when the field is absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss() -> bool:
    """Reset the peak RSS (``VmHWM``); ``False`` where the kernel does not allow it (peaks then span the process)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
