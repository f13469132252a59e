"""A process group whose backend serves one device only, and that device is not the CPU: what NCCL is on a GPU
machine (its device map is CUDA only: a CPU tensor handed to a collective raises "No backend type associated
with device type cpu"), made on a CPU machine. Run as a script by tests/distributed/test_cuda_paths.py (its own process:
the backend registration and PyTorch's lazy device are process-wide).

The device is PyTorch's lazy-tensor device ("lazy", computed on the CPU through TorchScript): a device of its
own that real tensors live on, so a collective given a CPU tensor is caught while the learner's model stays on
the CPU. The group is a group of one (FileStore): every collective is the identity, after checking the devices.

    python tests/helpers/lonely_group.py sharded FILE   -> rlvr.train.pg.sharded.ShardedGradients (GRPO + PPO's shared
                                                    critic) on Shards(device=lazy) vs accumulate_gradients
    python tests/helpers/lonely_group.py dp FILE        -> rlvr.distributed.dp.GradientWorker with its policy on lazy
Prints one JSON line: what was compared, and the collectives the group saw.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

SEEN: list[str] = []  # the collectives the group ran, by name


def register_lonely() -> torch.device:
    """Register the backend "lonely" (a group of one that serves the lazy device only) and start the lazy
    device; returns it."""
    import torch._lazy
    import torch._lazy.ts_backend

    torch._lazy.ts_backend.init()

    class Work(dist._Work):
        def __init__(self, result):
            super().__init__()
            self.fut = torch.futures.Future()
            self.fut.set_result(result)

        def wait(self, timeout=None):
            return True

        def get_future(self):
            return self.fut

    class Lonely(dist.ProcessGroup):
        def _check(self, name: str, tensors) -> None:
            for t in tensors:
                if t.device.type != "lazy":  # NCCL's words for a CPU tensor
                    raise RuntimeError(f"{name}: No backend type associated with device type {t.device.type}")
            SEEN.append(name)

        @property
        def _device_types(self):  # what torch's object collectives (broadcast_object_list, ...) serialize to
            return [torch.device("lazy")]

        def allreduce(self, tensors, opts=None):
            self._check("allreduce", tensors)
            return Work(tensors)

        def broadcast(self, tensors, opts=None):
            self._check("broadcast", tensors)
            return Work(tensors)

        def allgather(self, outputs, inputs, opts=None):
            self._check("allgather", inputs)
            for out, x in zip(outputs[0], inputs, strict=True):
                out.copy_(x)
            return Work(outputs)

        def barrier(self, opts=None):
            SEEN.append("barrier")
            return Work(None)

        def getBackendName(self):  # noqa: N802 - torch's name
            return "lonely"

    dist.Backend.register_backend("lonely", lambda store, rank, size, timeout: Lonely(rank, size),
                                  devices=["lazy"])
    return torch.device("lazy", 0)


def lonely_group(store_file: str) -> torch.device:
    """Initialise the default process group as a group of one on the "lonely" backend; returns its device."""
    device = register_lonely()
    dist.init_process_group("lazy:lonely", store=dist.FileStore(store_file, 1), rank=0, world_size=1)
    return device


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def sharded(store_file: str) -> dict:
    import copy

    from rlvr.algo import compute_advantages
    from rlvr.config import load_config
    from rlvr.models import build_tiny_model
    from rlvr.rollout import HFGenerator, SamplingSpec
    from rlvr.rollout.batch import rollouts_to_batch
    from rlvr.train.batching import BatchPlan, ForwardSpec
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.critic import Critic
    from rlvr.train.pg.objective import Minibatch, Objective, StepStats, accumulate_gradients
    from rlvr.train.pg.sharded import ShardedGradients, Shards

    device = lonely_group(store_file)
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=3)
    rollouts = HFGenerator(model, tok).generate(["12+7=", "3+45="], SamplingSpec(n=2, max_tokens=5, seed=11))
    batch = rollouts_to_batch(rollouts, tok.pad_token_id)
    adv = compute_advantages("group_mean", torch.tensor([1.0, 0.0, 0.5, 0.0]), 2)
    cfg = load_config(TrainConfig, None, ["sampling.n_prompts=2", "sampling.group_size=2", "algo.critic=shared",
                                          "algo.advantage=gae", "algo.kl_coef=0"])
    plan = BatchPlan(rollout_batch=4, train_batch=4, micro_batch=1, epochs=1, optimizer_steps_per_rollout_batch=1,
                     accumulation_steps=1, on_policy=True)
    objective = Objective(cfg.algo, 2, 5, plan)
    g = torch.Generator().manual_seed(0)
    adv_tok = adv.unsqueeze(1).expand(batch.labels.shape).contiguous()
    mb = Minibatch(batch, adv_tok, old_values=torch.randn(batch.labels.shape, generator=g) * 0.1,
                   returns=torch.randn(batch.labels.shape, generator=g))
    fwd = ForwardSpec.of(objective.algo, 1)  # one row a micro-batch: 4 backward passes
    model.train()
    twin = copy.deepcopy(model)
    critic, twin_critic = Critic(model, mode="shared", lr=1e-3, grad_clip=1.0), None
    twin_critic = Critic(twin, mode="shared", lr=1e-3, grad_clip=1.0)
    with torch.no_grad():  # a non-zero head, so that its gradient reaches the trunk
        for head in (critic.head, twin_critic.head):
            head.weight.copy_(torch.linspace(-0.5, 0.5, head.weight.numel()).view_as(head.weight))
    shards = Shards(0, 1, device, owns_group=False)
    stats, ent = StepStats(), {}
    loss = ShardedGradients(shards)(model, mb, objective.parts, fwd, critic=critic, stats=stats, row_entropy=ent)
    ref = accumulate_gradients(twin, mb, objective.parts, fwd, critic=twin_critic)
    a, b = _grads(model), _grads(twin)
    heads = [(p.grad, q.grad) for p, q in zip(critic.head.parameters(), twin_critic.head.parameters(), strict=True)]
    shards.barrier()
    out = {"loss": loss, "ref_loss": ref, "same_names": sorted(a) == sorted(b),
           "grad_gap": max(float((a[k] - b[k]).abs().max()) for k in a),
           "head_gap": max(float((x.cpu() - y).abs().max()) for x, y in heads),
           "head_on": sorted({str(x.device) for x, _ in heads}), "rows": sorted(ent), "seen": SEEN}
    dist.destroy_process_group()
    return out


def dp(store_file: str) -> dict:
    from rlvr.distributed.dp import GradientWorker

    device = register_lonely()  # the group itself is made by GradientWorker
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(device)
    x = torch.randn(4, 3)

    def grad_fn(m, mb, parts, fwd, **kw):
        loss = (m(x.to(device)) ** 2).sum()
        loss.backward()
        return float(loss)

    worker = GradientWorker(0, 1, f"file://{store_file}", model, grad_fn, backend="lazy:lonely")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    mb = SimpleNamespace(batch=SimpleNamespace(input_ids=torch.zeros(4, 2)))
    loss, flat, _, _ = worker.grads(state, mb, None, None, None, 0, None)
    cpu = torch.nn.Linear(3, 2)
    cpu.load_state_dict({k: v.cpu() for k, v in state.items()})
    ref = (cpu(x) ** 2).sum()
    ref.backward()
    want = torch.cat([p.grad.reshape(-1) for p in cpu.parameters()])
    out = {"loss": loss, "ref_loss": float(ref), "flat_on": str(flat.device),
           "grad_gap": float((flat - want).abs().max()), "seen": SEEN}
    worker.close()
    return out


if __name__ == "__main__":
    what, path = sys.argv[1], sys.argv[2]
    print(json.dumps({"sharded": sharded, "dp": dp}[what](path)))
