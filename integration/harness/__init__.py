"""Crash-test harness: a TCP proxy, a reference pipeline runner and helpers for the crash matrix."""
