"""The trace-driven simulator: ``peloton simulate``.

It replays a job trace through the *same* scheduling code as the daemon — the production
:class:`~peloton.resmgr.manager.ResourceManager` (pool tree, entitlements, work conservation,
admission, preemption) and the placement engine (:mod:`peloton.placement.engine`) — on a virtual
clock, with no database, no Mesos and no processes, so that queue policies can be compared on
real and synthetic traces by job completion time, waiting time by gang size and utilization.

Modules:

- :mod:`peloton.sim.trace` — the trace CSV (format, reader, writer), the synthetic Philly-like
  generator and its distributions, and the Microsoft Philly trace converter;
- :mod:`peloton.sim.cluster` — simulated hosts (from a minicluster agents file or generated) and
  what gangs hold on them, offered to placement as :class:`~peloton.core.offers.HostOffers`;
- :mod:`peloton.sim.ledger` — a lean in-memory job ledger implementing
  :class:`peloton.core.ledger.SchedulingLedger` with the job manager's state rules;
- :mod:`peloton.sim.simulator` — the discrete-event loop, the policies and the backfill
  baseline (what a run does at each instant, and the modelling choices);
- :mod:`peloton.sim.policy` — the policy names (the pools' queue policies, taken from
  :class:`~peloton.core.pools.QueuePolicy`, and ``baseline-backfill``);
- :mod:`peloton.sim.report` — the figures (JCT and wait percentiles overall and per gang size,
  utilization, fragmentation, preemptions, placement delay, pool shares) and the table;
- :mod:`peloton.sim.plots` — PNG plots (matplotlib, imported only when plots are asked for).

Example::

    peloton simulate generate --jobs 10000 --gpus 512 --load 0.9 --seed 1 -o trace.csv
    peloton simulate run --trace trace.csv --hosts 64 --gpus-per-host 8 --racks 8 \\
        --policy PRIORITY_FIFO --policy BACKFILL --policy baseline-backfill \\
        --json out.json --plots plots/

From Python::

    from peloton.sim import cluster, report, simulator, trace

    jobs = trace.generate(1000, 512, load=0.9, seed=1)
    result = simulator.simulate(jobs, cluster.generate_hosts(64, 8, racks=8), policy="FIFO")
    print(report.summarize(result)["jct_s"])

What is simplified (see :mod:`peloton.sim.simulator`): a placed gang starts at once and runs
exactly its trace duration; kills are instant; a preempted gang loses its work and restarts from
scratch; tasks never fail and hosts are never lost; elastic gangs are not simulated; the
daemon's once-a-second cycles happen only when something changes (plus one a cycle after a gang
starts waiting for what preemption could free).
"""
