"""`--workers N`: the supervisor, its workers, their messages, pod-wide state and metrics."""
