"""FSDP2 (fully_shard) training with sharded checkpoints through torch.distributed.checkpoint.

    torchrun --nproc_per_node=4 fsdp_dcp.py --steps 100 --ckpt-dir checkpoints
Every rank holds a shard of the model, so every rank takes part in each save and load.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class AppState:
    """What a checkpoint holds; DCP calls state_dict()/load_state_dict() on it."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state):
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])


def build_model():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))


def latest_step(ckpt_dir):
    meta = os.path.join(ckpt_dir, "latest.json")
    if not os.path.exists(meta):
        return None
    with open(meta) as f:
        return json.load(f)["step"]


def main(args):
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    mesh = init_device_mesh(device_type, (world,))
    model = build_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    start = 0
    step = latest_step(args.ckpt_dir)
    if step is not None:
        state = {"app": AppState(model, optimizer)}
        dcp.load(state, checkpoint_id=os.path.join(args.ckpt_dir, f"step{step}"))
        start = step + 1
        if rank == 0:
            print(f"resumed from step {step}")

    torch.manual_seed(rank)
    for step in range(start, args.steps):
        x = torch.randn(32, 64, device=device_type)
        y = x[:, :1] * 2.0
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if step % args.log_every == 0:
            pair = torch.tensor([loss.item() * len(x), float(len(x))], device=device_type)
            dist.all_reduce(pair)
            if rank == 0:
                print(f"step {step}: loss {(pair[0] / pair[1]).item():.4f}")

        if step % args.save_every == 0 or step == args.steps - 1:
            dcp.save({"app": AppState(model, optimizer)},
                     checkpoint_id=os.path.join(args.ckpt_dir, f"step{step}"))
            if rank == 0:
                with open(os.path.join(args.ckpt_dir, "latest.json"), "w") as f:
                    json.dump({"step": step}, f)
            dist.barrier()

    extra = os.path.join(args.ckpt_dir, "eval_batch.pt")
    if rank == 0:
        torch.save(torch.randn(8, 64), extra)
    dist.barrier()
    batch = torch.load(extra, map_location="cpu", weights_only=True)
    with torch.no_grad():
        score = model(batch.to(device_type)).mean()
    dist.all_reduce(score, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"eval score {score.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    main(parser.parse_args())
