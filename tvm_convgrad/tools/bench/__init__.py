"""``tvm-convgrad bench``: the package's kernels against PyTorch's, checked and timed in one run.

* :mod:`.cases`: the shape set and each case's gradients;
* :mod:`.measure`: timing both sides alike on a shared machine;
* :mod:`.results`: what a run found (results, failures, summaries);
* :mod:`.report`: the printed table, ``README.md`` and ``bench.png``;
* :mod:`.run`: the CPU bench against PyTorch's oneDNN (:func:`main`); :mod:`.cuda`: on a GPU against cuDNN.
"""

from .cases import OPS, SUITES, BenchCase, load_cases, onednn_result, tbe_result
from .measure import QuietGate, onednn_implementations, sample, timed_ours, torch_call
from .report import APIS, GOALS, format_table, markdown_report
from .results import BenchFailure, BenchResult, CheckFailed, checked, geomean, peak_fractions, summarize
from .run import main, run_bench

__all__ = [
    "APIS", "GOALS", "OPS", "SUITES", "BenchCase", "BenchFailure", "BenchResult", "CheckFailed", "QuietGate", "checked", "format_table",
    "geomean", "load_cases", "main", "markdown_report", "onednn_implementations", "onednn_result", "peak_fractions", "run_bench", "sample",
    "summarize", "tbe_result", "timed_ours", "torch_call",
]  # fmt: skip
