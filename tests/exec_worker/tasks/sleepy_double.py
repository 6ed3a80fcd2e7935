"""A KernelBench-style task (x * 2) whose reference takes as long as a test needs: each Model
sleeps SLEEP_S in each of its calls SLEEP_FROM + 1 .. SLEEP_CALLS (counted from 1) and raises
in call FAIL_AT (0: never).
The tests set these through the task's globals; a reference's trials are its first calls
(--trials 5: six of them, the last kept for the check after timing). The candidate's process
loads this module too but calls only its own ModelNew."""
import time

import torch
import torch.nn as nn

SLEEP_S = 0.0
SLEEP_CALLS = 0
SLEEP_FROM = 0
FAIL_AT = 0


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if SLEEP_FROM < self.calls <= SLEEP_CALLS:
            time.sleep(SLEEP_S)
        if self.calls == FAIL_AT:
            raise RuntimeError("the reference fails on purpose")
        return x * 2


def get_inputs():
    return [torch.randn(256)]


def get_init_inputs():
    return []
