"""The web console: the cluster at a glance, served by the daemon on a port of its own.

:mod:`~peloton.console.views` builds the JSON answers from snapshots (pure),
:mod:`~peloton.console.sources` reads those snapshots from the daemon's components,
:mod:`~peloton.console.api` answers each route as its caller, :mod:`~peloton.console.feed`
coalesces changes for the event streams and :mod:`~peloton.console.web` serves it all over HTTP(S)
with the static page. docs/console-api.md is the interface.
"""
