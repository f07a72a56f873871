"""The daemon's side of elastic gangs: their rendezvous endpoints (see
:mod:`peloton.elastic.endpoints`)."""
