"""`--workers N`: the supervisor, its workers, their channel, pod-wide state and metrics."""
