"""records.py - what a rollout hands to a trainer: samples, groups, weight-update figures.

Plain dataclasses over the wire records (pb.Sample, pb.ExecResult), holding Python lists so a
trainer can turn them into whatever tensors it uses (examples/verl_anvil.py pads them into
verl's layout). Logprobs are fp32 on the wire and stay fp32-exact in these floats. A resumed
sample (see Rollout.resume) is one Sample whose tokens are the partial tokens followed by the
continuation; `segments` says which weight version produced which slice.
"""
import dataclasses
from typing import List, Optional

from ._proto import pb


def finish_name(value):
    """'eos', 'length', 'aborted', ... for a pb.FinishReason value."""
    return pb.FinishReason.Name(value)[len("FINISH_"):].lower()


def exec_status_name(value):
    return pb.ExecStatus.Name(value)[len("EXEC_"):].lower()


@dataclasses.dataclass
class Segment:
    """A slice [start, end) of a sample's response tokens produced by one weight version."""
    start: int
    end: int
    weight_version: int


@dataclasses.dataclass
class Sample:
    task_index: int
    sample_index: int
    prompt_token_ids: List[int]
    response_token_ids: List[int]
    logprobs: List[float]             # fp32, one per response token
    response_mask: List[int]          # 1 for every response token the model produced
    finish_reason: str                # eos, stop, length, context, aborted, error, ...
    weight_version: int               # the oldest version that produced a token of it
    text: str = ""
    seed: Optional[int] = None
    error: Optional[str] = None
    worker_id: Optional[str] = None
    exec_status: Optional[str] = None  # correct, incorrect, compile_error, ... (scored jobs)
    reward: Optional[float] = None
    exec: Optional[object] = None      # the pb.ExecResult as recorded
    segments: List[Segment] = dataclasses.field(default_factory=list)
    terminal_ms: Optional[int] = None  # broker stream time the sample became final
    generated_ms: Optional[int] = None  # broker stream time its generation was recorded

    @property
    def aborted(self):
        return self.finish_reason == "aborted"

    @property
    def partial(self):
        """Cut short (aborted by a weights update, or cancelled with keep_partial): its
        tokens so far, resumable with resume_token_ids + resume_text."""
        return self.finish_reason in ("aborted", "cancelled")

    @classmethod
    def from_pb(cls, s, e=None):
        resp = list(s.token_ids)
        lps = list(s.logprobs)
        ver = s.weight_version
        out = cls(task_index=s.task_index, sample_index=s.sample_index,
                  prompt_token_ids=list(s.prompt_token_ids), response_token_ids=resp,
                  logprobs=lps, response_mask=[1] * len(resp),
                  finish_reason=finish_name(s.finish_reason), weight_version=ver,
                  text=s.text, seed=s.seed if s.HasField("seed") else None,
                  error=s.error if s.HasField("error") else None,
                  worker_id=s.worker_id if s.HasField("worker_id") else None,
                  segments=[Segment(0, len(resp), ver)])
        if e is not None and e.HasField("status"):
            out.exec = e
            out.exec_status = exec_status_name(e.status)
            out.reward = e.reward if e.HasField("reward") else None
        return out


@dataclasses.dataclass
class Group:
    """All n samples of one prompt, complete (each one terminal: finished, errored, scored)."""
    index: int                         # the prompt's position in generate()'s list
    prompt: object                     # the prompt as given
    samples: List[Sample]
    custom_id: Optional[str] = None
    job_id: Optional[str] = None
    delivered_ms: Optional[int] = None  # wall clock ms the iterator returned it
    regenerated: int = 0               # times it was generated again for staleness

    @property
    def rewards(self):
        return [s.reward for s in self.samples]

    @property
    def weight_versions(self):
        return sorted({s.weight_version for s in self.samples})

    @property
    def oldest_version(self):
        return min(s.weight_version for s in self.samples)

    @property
    def last_sample_ms(self):
        """Broker time the group's last sample became final (scored, for scored jobs)."""
        ts = [s.terminal_ms for s in self.samples if s.terminal_ms is not None]
        return max(ts) if ts else None

    @property
    def last_generated_ms(self):
        ts = [s.generated_ms for s in self.samples if s.generated_ms is not None]
        return max(ts) if ts else None

    @property
    def delivery_latency_ms(self):
        """From the group's last sample becoming final to its delivery to the trainer."""
        last = self.last_sample_ms
        return None if last is None or self.delivered_ms is None else self.delivered_ms - last


@dataclasses.dataclass
class WeightsUpdate:
    version: int
    workers: int          # gen workers that report the version
    load_s: float         # the slowest worker's load
    control_ms: float     # broker-measured time beyond the slowest load
    total_ms: float       # the client's round trip
    policy: str

    @property
    def client_control_ms(self):
        """The client's round trip minus the slowest load: control-plane cost as the trainer
        sees it (the socket hops included)."""
        return max(0.0, self.total_ms - self.load_s * 1000.0)
