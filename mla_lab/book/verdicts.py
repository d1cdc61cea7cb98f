"""Conclusions, checked: a chapter's verdicts print a statement written before the run and whether the
measurements bear it out."""

from __future__ import annotations


def every(values, test) -> bool | None:
    """``test`` holds for every value (a dict's values, or any iterable); ``None`` if there are none."""
    vals = list(values.values() if isinstance(values, dict) else values)
    if not vals:
        return None
    return all(test(v) for v in vals)


def verdict(statement: str, holds: bool | None) -> None:
    """Print one conclusion and whether the measurements bear it out.

    The line must read the same on any machine the chapter runs on, so it
    holds no measured number: the statement names its margin ("by more than
    10%"), the measurement decides True or False.  ``None`` (nothing was
    measured to decide it) prints as such, never as True.
    """
    print(f"{statement}: {'not measured' if holds is None else bool(holds)}")
