"""Run the ``fabric`` command in this process and record its peak resident memory.

    python -m tests.helpers.peak_rss RESULT.json fabric-args...

The command runs exactly as ``python -m fabric.cli.main fabric-args...`` would.
On exit, the process's own high-water RSS (``VmHWM`` in /proc/self/status,
which belongs to the address space created at exec and so excludes whatever
the parent process had resident) is written to RESULT.json as
``{"vm_hwm_bytes": N, "exit_code": C}``.

(``ru_maxrss`` from ``wait4`` is not usable for this: at exec the kernel
folds the pre-exec address space, i.e. the parent's when the child was
vforked, into the child's maximum.)
"""

from __future__ import annotations

import json
import runpy
import sys


def vm_hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    result_path, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["fabric", *args]
    code: object = 0
    try:
        runpy.run_module("fabric.cli.main", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    finally:
        with open(result_path, "w") as f:
            json.dump({"vm_hwm_bytes": vm_hwm_bytes(), "exit_code": code if isinstance(code, int) else 1}, f)
    sys.exit(code)


if __name__ == "__main__":
    main()
