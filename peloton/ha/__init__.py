"""Several daemons on one database: the leader lease and the election of the one that schedules."""
