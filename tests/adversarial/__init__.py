"""Regression tests from the adversarial review (issue 14): misuse, bad settings, hostile clients."""
