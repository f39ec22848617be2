"""The ``tvm-convgrad`` command as the tests run it: as a process of its own (the installed entry
point, as a user runs it), or in the test's process through :func:`tvm_convgrad.cli.main` where a
test checks what a command does rather than its process. A new Python process first imports TVM
(which imports PyTorch and ml_dtypes): ~7 s of a core on the 2-core Zen 3 (2026-12-02), longer than
most of the commands the tests run then take."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys

__all__ = ["cli", "cli_in_process"]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``tvm-convgrad ARGS`` as a process (``python -m tvm_convgrad.cli`` where the entry point is not on PATH)."""
    exe = shutil.which("tvm-convgrad")
    command = [exe] if exe else [sys.executable, "-m", "tvm_convgrad.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout)


def cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """``tvm-convgrad ARGS`` run by :func:`tvm_convgrad.cli.main` in this process: its status and what
    it printed, as :func:`cli` returns them (a ``SystemExit`` as Python ends a process with it:
    argparse's errors exit 2, a message is printed and exits 1)."""
    from tvm_convgrad.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:
            code = exit_.code or 0
            if not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
    return subprocess.CompletedProcess(["tvm-convgrad", *args], code, out.getvalue(), err.getvalue())
