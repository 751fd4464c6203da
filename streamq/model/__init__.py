"""The job model floor: the server-side calls of a job on its own stream, of the
small-job lane, of a queue and its dead letters, and the view of a queue the parts need."""
