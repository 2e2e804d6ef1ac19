"""Ending a process that ran gloo collectives: flush its output, then ``os._exit``, never finalize the interpreter.

torch's gloo worker threads (``pt_gloo_runloop``) drop their reference to a
finished collective's work only after the caller's ``wait()`` has returned.
When Python has let go of that work's tensors by then (``all_gather_object``
does), this last reference frees their Python objects, which takes the GIL.
Once the interpreter is finalizing, taking the GIL ends the thread
(``pthread_exit``), and that unwinding through torch's ``noexcept`` frames
calls ``std::terminate``: "terminate called without an active exception",
SIGABRT (a core dump shows ``~AsyncAllgatherWork`` in ``runLoop`` ->
``decref_pyobject`` -> ``take_gil`` -> ``PyThread_exit_thread``). It takes no
more than a worker thread descheduled between the end of the collective and
the end of the process, which a loaded machine does. ``destroy_process_group``
does not join those threads: the mesh and FSDP2 still hold the groups. So the
only end that cannot race is one that never finalizes: the zygote's workers and
every multi-rank process (``torch.multiprocessing.spawn``'s) end here.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn


def exit_without_finalizing(code: int = 0) -> NoReturn:
    """Flush stdout and stderr, then end the process with ``code``, skipping interpreter finalization."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: the exit code still tells
            stream.flush()
    os._exit(code)
