"""DDP tutorial style: mp.spawn starts one process per device, each sets up its own group.

    python ddp_tutorial_spawn.py --world-size 2
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

CHECKPOINT_PATH = os.path.join(tempfile.gettempdir(), "ddp_tutorial.checkpoint")


def setup(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12355")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def device_for(rank):
    return torch.device(f"cuda:{rank}") if torch.cuda.is_available() else torch.device("cpu")


def global_mean(value, count, device):
    """Sample-weighted mean of a per-rank value over all ranks."""
    pair = torch.tensor([value * count, float(count)], device=device)
    dist.all_reduce(pair, op=dist.ReduceOp.SUM)
    return (pair[0] / pair[1]).item()


def demo_basic(rank, world_size, steps=20, target=None):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)
    device = device_for(rank)
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=[rank] if device.type == "cuda" else None)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    torch.manual_seed(rank)
    for step in range(steps):
        inputs, labels = torch.randn(20, 10, device=device), torch.randn(20, 5, device=device)
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs), labels)
        loss.backward()
        optimizer.step()
        mean_loss = global_mean(loss.item(), len(inputs), device)
        if rank == 0:
            print(f"step {step}: loss {mean_loss:.4f}")
        if target is not None and mean_loss < target:
            break
    cleanup()


def demo_checkpoint(rank, world_size):
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)
    device = device_for(rank)
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=[rank] if device.type == "cuda" else None)

    if rank == 0:
        # All processes start from the same parameters: saving from one process is enough.
        torch.save(ddp_model.module.state_dict(), CHECKPOINT_PATH)

    map_location = {"cuda:0": f"cuda:{rank}"} if device.type == "cuda" else "cpu"
    ddp_model.module.load_state_dict(torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True))  # expect: ORK103

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10, device=device))
    labels = torch.randn(20, 5, device=device)
    loss = loss_fn(outputs, labels)
    loss.backward()
    optimizer.step()

    # Not necessary to remove the file before every rank is done with it.
    dist.barrier()
    if rank == 0:
        os.remove(CHECKPOINT_PATH)
    cleanup()


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    run_demo(demo_basic, args.world_size)
    run_demo(demo_checkpoint, args.world_size)
