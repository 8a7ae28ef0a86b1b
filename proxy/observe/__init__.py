"""What every layer reports into: metrics, logs, the request record."""
