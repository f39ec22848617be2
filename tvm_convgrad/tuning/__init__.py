"""Autotuning on MetaSchedule over the schedule rules' own space (:func:`tune`); the records it keeps
are read at build time by :mod:`tvm_convgrad.compile.records`."""

from .runners import runner_from
from .tune import KEEP_MARGIN, TuneReport, tune

__all__ = ["KEEP_MARGIN", "TuneReport", "runner_from", "tune"]
