"""A nanoGPT-style script: everything at module level, a master_process flag, gradient accumulation.

Single process:  python nanogpt_style.py
DDP, 4 ranks:    torchrun --standalone --nproc_per_node=4 nanogpt_style.py
"""

import math
import os
import time
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.distributed import all_reduce, destroy_process_group, init_process_group, ReduceOp
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
out_dir = "out"
eval_interval = 200
log_interval = 10
eval_iters = 20
max_iters = 2000
init_from = "scratch"  # or "resume"
gradient_accumulation_steps = 8
batch_size = 12
block_size = 64
vocab_size = 256
learning_rate = 6e-4
target_val_loss = None
# -----------------------------------------------------------------------------

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}" if torch.cuda.is_available() else "cpu"
    master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
    device = "cuda" if torch.cuda.is_available() else "cpu"

if master_process:
    os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(1337 + seed_offset)
ctx = nullcontext()

data = torch.randint(vocab_size, (100_000,), generator=torch.Generator().manual_seed(0))


def get_batch(split):
    half = len(data) // 2
    source = data[:half] if split == "train" else data[half:]
    ix = torch.randint(len(source) - block_size, (batch_size,))
    x = torch.stack([source[i:i + block_size] for i in ix])
    y = torch.stack([source[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 64)
        self.head = nn.Linear(64, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        loss = None
        if targets is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))
        return logits, loss


iter_num = 0
best_val_loss = 1e9
model = TinyLM()
if init_from == "resume":
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    checkpoint = torch.load(ckpt_path, map_location=device, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank] if torch.cuda.is_available() else None)
raw_model = model.module if ddp else model  # unwrap DDP container if needed


@torch.no_grad()
def estimate_loss():
    """Mean loss over eval_iters batches on every rank, averaged over the ranks."""
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        mean = losses.mean()
        if ddp:
            all_reduce(mean, op=ReduceOp.AVG)
        out[split] = mean.item()
    model.train()
    return out


def get_lr(it):
    warmup, decay = 100, max_iters
    if it < warmup:
        return learning_rate * it / warmup
    ratio = min(1.0, (it - warmup) / (decay - warmup))
    return 0.1 * learning_rate + 0.5 * (1.0 + math.cos(math.pi * ratio)) * 0.9 * learning_rate


X, Y = get_batch("train")
t0 = time.time()
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    if iter_num % eval_interval == 0:
        losses = estimate_loss()  # every rank takes part: it all-reduces
        if master_process:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss and iter_num > 0:
            best_val_loss = losses["val"]
            if master_process:
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                }
                print(f"saving checkpoint to {out_dir}")
                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
        if target_val_loss is not None and losses["val"] < target_val_loss:
            break

    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            # only sync gradients at the last micro step
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num % log_interval == 0:
        lossf = loss.item() * gradient_accumulation_steps  # approximate
        if master_process:
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms")  # expect: ORK104
    iter_num += 1
    if iter_num > max_iters:
        break

if ddp:
    destroy_process_group()
