"""The one reset of the drop-in's settled routes.

A signature's route (which forward, which autograd node, whose gradients) settles after its first
calls, and :mod:`.native` then takes its later calls without the Python checks. Every setting that
changes a route (:func:`.forward.set_forward`, :func:`.backward.set_backward`,
:func:`.native.set_native`, :func:`.outputs.set_outputs`) calls :func:`reset`, which runs the
hooks registered with :func:`on_reset`. (A module of its own: the settings' modules sit below
:mod:`.native`, which they could not import.)
"""

from __future__ import annotations

from typing import Callable

__all__ = ["on_reset", "reset"]

_HOOKS: list[Callable[[], None]] = []


def on_reset(hook: Callable[[], None]) -> None:
    """Run ``hook`` at every :func:`reset`."""
    _HOOKS.append(hook)


def reset() -> None:
    """Forget every settled route (a setting changed)."""
    for hook in _HOOKS:
        hook()
