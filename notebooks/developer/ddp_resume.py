"""Resume a DDP run from ckpt.pt (written by ddp_save_log.py), or start fresh if there is none.

Run from a terminal:   torchrun --nproc_per_node=2 ddp_resume.py
Developer lesson, notebook 01_save_log_resume.ipynb.
"""
import os
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="gloo")
rank = dist.get_rank()

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

start_step = 0
if os.path.exists("ckpt.pt"):
    # every rank loads, onto the CPU, into the plain model, BEFORE wrapping it in DDP
    ckpt = torch.load("ckpt.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    start_step = ckpt["step"]

ddp = DDP(model)   # wrapping broadcasts rank 0's weights: every rank starts identical
print(f"rank {rank}: resuming from step {start_step}, "
      f"weight checksum {ddp.module.weight.sum().item():.6f}")

dist.destroy_process_group()
