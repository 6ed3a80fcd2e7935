"""test_verl_example.py - the parts of cli/python/examples/verl_anvil.py that run without
verl, against a real cluster: the rollout facade lays complete groups out as verl's tensors
(left-padded prompts, right-padded responses, masks, fp32 rollout logprobs aligned with the
tokens, one uid per group), the reward manager puts each reward on the last response token,
and a trainer-side checkpoint (transformers save_pretrained of changed weights) becomes the
next weight version whose outputs match anvil-generate on that directory.
"""
import os
import sys

import pytest

from conftest import REPO, reference

sys.path.insert(0, os.path.join(REPO, "cli", "python", "examples"))


def test_verl_rollout_layout_and_weight_sync(cluster, anvil_client, weights, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import verl_anvil
    cluster.start_gen_worker("gen0", weights[0], "--threads", "1")
    cluster.wait_workers(1, "gen")
    pad = 1
    ro = verl_anvil.AnvilRollout(cluster.client_ep, n=2, pad_token_id=pad, score=False,
                                 chat=False, sampling={"temperature": 0.0, "max_tokens": 12},
                                 max_weight_lag=0)
    try:
        prompts = ["def relu(x):", "import torch\nimport triton.language as tl\n", "x = 1"]
        out = ro.generate_sequences(prompts)
        b, nt = out["batch"], out["non_tensor_batch"]
        bs = 6
        P, R = b["prompts"].shape[1], b["responses"].shape[1]
        assert b["input_ids"].shape == (bs, P + R) and b["rollout_log_probs"].dtype == torch.float32
        # interleaved: the 2 samples of a prompt side by side, one uid per group
        assert len(set(nt["uid"])) == 3 and all(nt["uid"][2 * i] == nt["uid"][2 * i + 1]
                                                 for i in range(3))
        for i in range(bs):
            L = int(b["response_mask"][i].sum())
            assert L > 0 and b["response_mask"][i, :L].all() and not b["response_mask"][i, L:].any()
            assert (b["rollout_log_probs"][i, :L] < 0).all() and (b["rollout_log_probs"][i, L:] == 0).all()
            assert (b["responses"][i, L:] == pad).all()
            np_ = int(b["attention_mask"][i, :P].sum())
            assert np_ > 0 and b["attention_mask"][i, P - np_:P].all()  # left-padded
            assert int(b["position_ids"][i, P - 1]) == np_ - 1
            assert nt["anvil_weight_version"][i] == 0
        scores = verl_anvil.AnvilRewardManager()(
            {"batch": b, "non_tensor_batch": dict(nt, anvil_reward=[float(i) for i in range(bs)])})
        for i in range(bs):
            L = int(b["response_mask"][i].sum())
            assert float(scores[i, L - 1]) == float(i) and float(scores[i].sum()) == float(i)

        # the trainer's side: changed weights saved as a HF checkpoint -> version 1
        model = transformers.AutoModelForCausalLM.from_pretrained(weights[0])
        with torch.no_grad():
            for p in model.model.layers[0].mlp.parameters():
                p.mul_(-1.5)
        ck = verl_anvil.save_hf_checkpoint(model, weights[0], str(tmp_path / "step-1"))
        u = ro.update_weights(ck, 1)
        assert u.workers == 1
        groups = ro.rollout(prompts)
        assert all(s.weight_version == 1 for g in groups for s in g.samples)
        changed = 0
        for g in groups:
            s = g.samples[0]
            ref = reference(ck, s.prompt_token_ids, 1, 12, 0.0)[0]
            assert s.response_token_ids == ref["token_ids"]
            old = reference(weights[0], s.prompt_token_ids, 1, 12, 0.0)[0]
            changed += old["token_ids"] != ref["token_ids"]
        assert changed > 0
    finally:
        ro.close()
