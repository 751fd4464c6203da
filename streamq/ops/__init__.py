"""The operations floor: reading a queue's state, setting up a server, access roles, the
generated docs."""
