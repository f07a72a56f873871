"""Placement: admitted gangs onto hosts, all or nothing (first fit for now)."""
