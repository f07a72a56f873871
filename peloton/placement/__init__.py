"""Placement: admitted gangs onto hosts, all or nothing.

``engine`` packs a gang onto the fewest hosts and racks with best fit (or spreads it), keeping
GPUs whole; ``firstfit`` is the task-by-task baseline it is measured against; ``launcher`` takes
admitted gangs, places them, leases the hosts and launches one task group per host.
"""
