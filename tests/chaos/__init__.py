"""The seeded chaos run with a ledger (issue 20): clients of every kind against `--workers 2` in
front of a scripted vLLM that misbehaves, every request written down and checked afterwards."""
