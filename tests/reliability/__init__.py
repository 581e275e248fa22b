"""Reliability and security tests: crash safety, storage errors, bad inputs, dashboard security."""
