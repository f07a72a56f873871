"""The ``peloton`` command line."""
