"""The host manager: peloton as a Mesos framework (offers, leases, launches, status updates)."""
