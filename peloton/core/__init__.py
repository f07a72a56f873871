"""The shared domain: what every component and the storage speak.

Resources and their amounts, gangs and the environment their tasks start with, job specs, task
and job states, the records the job manager keeps, attempt ids, constraints, pool configs, host
records, lost capacity. Everything here is pure (no I/O) and imports nothing of peloton but
:mod:`peloton.errors` and the generated API types; every component and :mod:`peloton.storage`
depend downward on it only.
"""
