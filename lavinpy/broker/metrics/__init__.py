"""Counters, rates and their history."""
