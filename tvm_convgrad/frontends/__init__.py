"""Operator-level frontends that map other input forms onto the gradient computes."""
