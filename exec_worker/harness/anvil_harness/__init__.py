"""anvil_harness - the Python side of Anvil's execution worker.

Runs inside the sandbox that anvil-exec-worker (C) starts. One process serves one role for its
whole life: a *reference* process (runs only task code: reference models, input generation,
static checks of candidate text) or a *candidate* process (runs exactly one candidate). The C
worker talks to it over two pipes with JSON lines (server.py) and reads the tensors it writes
(tensorio.py) itself; nothing a process says decides a verdict.
"""
