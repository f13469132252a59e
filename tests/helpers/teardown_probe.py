"""Imported first by a subprocess (`python -c "import helpers.teardown_probe; ..."`): when the interpreter
begins its teardown (threading's shutdown, the first thing Py_FinalizeEx does, never reached after
os._exit), the names of the process's live threads are written to the file RLVR_TEARDOWN_PROBE names, one per
line. tests/train/pg/test_sharded.py reads it: gloo's threads (gloo_tcp_loop, pt_gloo_runloop) alive at that
point are what aborts a sharded run at exit (rlvr.train.pg.sharded.exit_process)."""

import glob
import os
import threading


def _write_threads(path: str = os.environ["RLVR_TEARDOWN_PROBE"]) -> None:
    names = []
    for comm in glob.glob("/proc/self/task/*/comm"):
        with open(comm) as f:
            names.append(f.read().strip())
    with open(path, "w") as f:
        f.write("\n".join(sorted(names)) + "\n")


threading._register_atexit(_write_threads)  # (runs at threading._shutdown, before atexit's handlers)
