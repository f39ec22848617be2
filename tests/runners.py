"""MetaSchedule runners for tests on machines that cannot time the candidates themselves (no GPU,
or a CPU target the host cannot run)."""

from __future__ import annotations

import tvm
from tvm.s_tir import meta_schedule as ms

__all__ = ["TimedByPosition"]


@tvm.ir.utils.derived_object
class TimedByPosition(ms.runner.PyRunner):
    """A runner for a machine without a GPU: it runs nothing and times the candidates of a batch by
    their position (1 s, 1/2 s, ...). A tuning run goes through MetaSchedule's whole loop (sampling,
    GPU verification, nvcc builds); in its last batch (the default, then the best candidate) the
    best candidate is twice as fast, so it is kept unless it is the default itself."""

    def run(self, runner_inputs):
        return [Timed(1.0 / (position + 1)) for position in range(len(runner_inputs))]


@tvm.ir.utils.derived_object
class Timed(ms.runner.PyRunnerFuture):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def done(self) -> bool:
        return True

    def result(self) -> ms.runner.RunnerResult:
        return ms.runner.RunnerResult([self.seconds], None)
