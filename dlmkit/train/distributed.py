"""Process-group setup for torchrun (one process = world size 1, no process group)."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class World:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_world(device_spec: str = "auto") -> World:
    """Join torchrun's process group if launched by it (gloo on CPU, nccl on CUDA)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_spec == "auto":
        device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(device_spec)
    if device.type == "cuda":
        if device.index is None:
            # "cuda" means this process's GPU; torch.cuda.set_device rejects a device without
            # an index on some torch versions (2.11), and under torchrun each rank has its own.
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(rank, world_size, local_rank, device)


def all_reduce_sum(tensor: torch.Tensor, world: World) -> torch.Tensor:
    if world.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def shutdown(world: World, *, clean: bool = True) -> None:
    """Leave the process group. After a clean run the ranks tear down together: a rank that
    destroys its gloo group while a peer is still busy (rank 0 draws the loss curve after the
    last collective) can abort that peer. After an error no barrier (the peer may never come).

    The run's model and optimizer are collected first, while the group is alive: FSDP2 modules
    sit in reference cycles, so otherwise they (and any gloo work objects they hold) die only at
    interpreter exit, after the group. A likely cause of a rare abort of rank 1 at exit (SIGABRT,
    "terminate called without an active exception"; once, in a 2-rank dflash FSDP2 test under
    load, after training had finished)."""
    if world.distributed and dist.is_initialized():
        gc.collect()
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def shard_units(model) -> list[list]:
    """The groups of modules FSDP2 shards one by one (then the root takes the rest): the
    outermost modules of the classes a Hugging Face model names in ``_no_split_modules`` — its
    transformer layers, wherever they sit (a causal LM's ``model.layers``, DiffusionGemma's
    encoder and decoder stacks) — or, for a model without that list, ``model.layers``. Units
    that share a parameter form one group: FSDP2 requires a tied parameter in one group, and
    DiffusionGemma's canvas decoder layers reuse their encoder layers' weights."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if not names:
        return [[layer] for layer in getattr(getattr(model, "model", model), "layers", [])]
    units: list = []
    for name, module in model.named_modules():  # parents come before their children
        if type(module).__name__ in names and not any(
                name.startswith(f"{outer}.") for outer, _ in units):
            units.append((name, module))
    groups: list[list] = []
    owner: dict[int, list] = {}  # id(parameter) -> the group holding it
    for _, module in units:
        joined = {id(g): g for p in module.parameters() if (g := owner.get(id(p))) is not None}
        group = [module]
        for other in joined.values():
            group = other + group
            groups.remove(other)
        groups.append(group)
        for member in group:
            for p in member.parameters():
                owner[id(p)] = group
    return groups


def wrap_model(model, world: World, kind: str, mp_policy=None):
    """DDP or FSDP2 (``fully_shard``) when distributed; the model itself otherwise.
    ``mp_policy``: FSDP2's ``MixedPrecisionPolicy`` (:func:`.precision.fsdp_policy`); DDP
    computes in bf16 through autocast alone."""
    if not world.distributed:
        return model
    if kind == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = mp_policy or MixedPrecisionPolicy()
        for group in shard_units(model):
            fully_shard(group if len(group) > 1 else group[0], mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[world.device] if world.device.type == "cuda"
                                   else None)
