"""Turning results into tables people read."""
