"""`cbo solve`, `cbo qubo info|random`, `cbo solvers`, `cbo demo`: commands on QUBO files."""
