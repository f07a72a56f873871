"""peloton: a GPU gang scheduler for distributed deep learning on Apache Mesos."""

__version__ = "0.1.0"
