"""Renderers: one module per output format. Each takes a CheckResult and returns text."""
