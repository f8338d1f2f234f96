"""Lightweight streams: millions of streams multiplexed onto a few shared logs."""
