"""``python -m bench.peak_rss MODULE [ARGS...]``: run MODULE as ``__main__``, then print its peak RSS.

The peak is ``VmHWM`` from /proc/self/status, the high-water mark of this
process's own address space since exec. ``ru_maxrss`` would not do: Linux
carries it across exec, so a child forked from a large benchmark process
reports the parent's footprint. Prints ``peak_rss_kb=N`` as the last line on
stderr and exits with MODULE's exit code.
"""
from __future__ import annotations

import runpy
import sys


def vm_hwm_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/status has no VmHWM line (not Linux?)")


def main() -> int:
    module = sys.argv[1]
    sys.argv = sys.argv[1:]
    code: int = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    print(f"peak_rss_kb={vm_hwm_kb()}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
