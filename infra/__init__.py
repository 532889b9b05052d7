"""Local development infrastructure (servers used by tests, the run command and benches)."""
