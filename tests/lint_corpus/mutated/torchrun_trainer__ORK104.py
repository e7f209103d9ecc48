"""A torchrun job with a Trainer class and snapshots it can resume from.

    torchrun --nproc_per_node=4 torchrun_trainer.py 50 10 --snapshot snapshot.pt
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomRegression(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 20, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def ddp_setup():
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    init_process_group(backend=backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.device = torch.device(f"cuda:{self.local_rank}") if torch.cuda.is_available() else torch.device("cpu")
        self.model = model.to(self.device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print(f"[rank {self.global_rank}] loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[self.local_rank] if torch.cuda.is_available() else None)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"[rank {self.global_rank}] resuming training from snapshot at epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        total, count = 0.0, 0
        for source, targets in self.train_data:
            source, targets = source.to(self.device), targets.to(self.device)
            batch_loss = self._run_batch(source, targets)
            if self.global_rank == 0 and count % 640 == 0:
                print(f"Epoch {epoch} | step loss {batch_loss:.4f}")  # expect: ORK104
            total += batch_loss * len(source)
            count += len(source)
        stats = torch.tensor([total, float(count)], device=self.device)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        return (stats[0] / stats[1]).item()

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        tmp = self.snapshot_path + ".tmp"
        torch.save(snapshot, tmp)
        os.replace(tmp, self.snapshot_path)
        print(f"Epoch {epoch} | training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs, target_loss=None):
        for epoch in range(self.epochs_run, max_epochs):
            epoch_loss = self._run_epoch(epoch)
            if self.global_rank == 0:
                print(f"Epoch {epoch} | loss over all ranks {epoch_loss:.4f}")
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
            dist.barrier()
            if target_loss is not None and epoch_loss < target_loss:
                break


def load_train_objs():
    train_set = RandomRegression(2048)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=torch.cuda.is_available(), shuffle=False,
                      sampler=DistributedSampler(dataset))


def main(save_every, total_epochs, batch_size, snapshot_path):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    parser.add_argument("--snapshot", default="snapshot.pt")
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.snapshot)
