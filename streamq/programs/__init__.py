"""The programs floor, made of roles: the demo pipeline, the reaper's schedule, a worker's
own recovery passes."""
