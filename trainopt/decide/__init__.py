"""Decisions as pure functions over plain data: the plan, batch probes, the sequential rule, screen selection, verdicts, the stability guard, the recommendation."""
