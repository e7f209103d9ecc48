"""One DDP step, an honest loss across ranks, and a checkpoint written by rank 0 only.

Run from a terminal:   torchrun --nproc_per_node=2 ddp_save_log.py
Writes ckpt.pt in the current folder (read back by ddp_resume.py).
--backend gloo (the default without a GPU) runs on CPUs; --backend nccl (the default when CUDA is
available) puts each rank on the GPU cuda:LOCAL_RANK. Only the gloo path is run by the course's tests.
Developer lesson, notebooks 01_save_log_resume.ipynb and 05_checkpointing_in_practice.ipynb.
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--backend", choices=["gloo", "nccl"],
                    default="nccl" if torch.cuda.is_available() else "gloo")
args = parser.parse_args()
if args.backend == "nccl" and not torch.cuda.is_available():
    parser.error("--backend nccl needs CUDA GPUs, and none is visible: use --backend gloo")
# gloo: every tensor on the CPU; nccl: every tensor on this rank's own GPU
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if args.backend == "nccl" else "cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)

dist.init_process_group(backend=args.backend, device_id=device if device.type == "cuda" else None)
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)                      # same starting weights on every rank
model = nn.Linear(4, 1).to(device)
ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

torch.manual_seed(50 + rank)              # but different data on every rank
x, y = torch.randn(6, 4).to(device), torch.randn(6, 1).to(device)

# one training step
opt.zero_grad(set_to_none=True)
loss = nn.functional.mse_loss(ddp(x), y)
loss.backward()
opt.step()

# the loss over ALL samples: add up [loss * count, count] from every rank, divide once
local = torch.tensor([loss.item() * len(x), len(x)], dtype=torch.float64, device=device)
dist.all_reduce(local, op=dist.ReduceOp.SUM)
global_loss = (local[0] / local[1]).item()
print(f"rank {rank}: my loss {loss.item():.4f} | "
      f"true loss over all {int(local[1])} samples {global_loss:.4f}")

# one writer, everyone waits
if rank == 0:
    torch.save({"model": ddp.module.state_dict(),   # .module: keys without "module."
                "opt": opt.state_dict(), "step": 1}, "ckpt.pt")
dist.barrier()                            # no rank reads before rank 0 has finished writing

ckpt = torch.load("ckpt.pt", map_location="cpu", weights_only=True)
print(f"rank {rank}: loaded keys {list(ckpt['model'])}")

dist.destroy_process_group()
