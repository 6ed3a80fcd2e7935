"""anvil_client - Anvil as the rollout + reward backend of an RL trainer.

    from anvil_client import AnvilClient
    async with AnvilClient("tcp://127.0.0.1:5555") as c:
        async for group in c.generate(prompts, n=8, sampling={"max_tokens": 512}):
            ...                      # group.samples: token ids, logprobs, rewards
        await c.update_weights("/ckpt/step-1", version=1)

See cli/python/README.md.
"""
from ._proto import PROTOCOL_VERSION, pb
from .client import AnvilClient, Rollout, make_task
from .connection import AnvilError
from .records import Group, Sample, Segment, WeightsUpdate

__all__ = ["AnvilClient", "AnvilError", "Group", "PROTOCOL_VERSION", "Rollout", "Sample",
           "Segment", "WeightsUpdate", "make_task", "pb"]
