"""Benchmarks of the course's machinery (`make bench`). Results are printed, never asserted in tests."""
