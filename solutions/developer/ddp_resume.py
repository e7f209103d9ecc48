"""Resume a DDP run from ckpt.pt (written by ddp_save_log.py), or start fresh if there is none.

Run from a terminal:   torchrun --nproc_per_node=2 ddp_resume.py
--backend gloo (the default without a GPU) or nccl (the default when CUDA is available), as in
ddp_save_log.py. Only the gloo path is run by the course's tests.
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
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if args.backend == "nccl" else "cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)

dist.init_process_group(backend=args.backend, device_id=device if device.type == "cuda" else None)
rank = dist.get_rank()

torch.manual_seed(0)
model = nn.Linear(4, 1).to(device)        # on its device first, then the optimizer
opt = torch.optim.SGD(model.parameters(), lr=0.1)

start_step = 0
if os.path.exists("ckpt.pt"):
    # every rank loads, onto the CPU, into the plain model, BEFORE wrapping it in DDP
    ckpt = torch.load("ckpt.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])  # copies the CPU tensors into the model's device
    opt.load_state_dict(ckpt["opt"])      # moves the optimizer's state to its parameters' device
    start_step = ckpt["step"]

ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
# wrapping broadcasts rank 0's weights: every rank starts identical
print(f"rank {rank}: resuming from step {start_step}, "
      f"weight checksum {ddp.module.weight.sum().item():.6f}")

dist.destroy_process_group()
