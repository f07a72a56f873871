"""Job manager: jobs, tasks and gangs, their state machines and their lifecycle."""
