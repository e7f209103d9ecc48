"""Classification training in the torchvision references' style: distributed helpers at the top
(save_on_master, setup_for_distributed), a train_one_epoch / evaluate pair, checkpoints every epoch.

    torchrun --nproc_per_node=8 torchvision_reference.py --output-dir out --epochs 90
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.utils.data
from torch import nn


def is_dist_avail_and_initialized():
    if not dist.is_available():
        return False
    if not dist.is_initialized():
        return False
    return True


def get_world_size():
    if not is_dist_avail_and_initialized():
        return 1
    return dist.get_world_size()


def get_rank():
    if not is_dist_avail_and_initialized():
        return 0
    return dist.get_rank()


def is_main_process():
    return get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


def setup_for_distributed(is_master):
    """Disable printing on every process but the master one (pass force=True to print anyway)."""
    import builtins as __builtin__

    builtin_print = __builtin__.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    __builtin__.print = print


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    else:
        print("Not using distributed mode")
        args.distributed = False
        return
    args.distributed = True
    if torch.cuda.is_available():
        torch.cuda.set_device(args.gpu)
    args.dist_backend = "nccl" if torch.cuda.is_available() else "gloo"
    print(f"| distributed init (rank {args.rank})", flush=True)
    dist.init_process_group(backend=args.dist_backend, world_size=args.world_size, rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)


def reduce_across_processes(val):
    if not is_dist_avail_and_initialized():
        return torch.tensor(val)
    t = torch.tensor(val, dtype=torch.float64)
    dist.barrier()
    dist.all_reduce(t)
    return t


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, print_freq):
    model.train()
    seen, loss_sum = 0, 0.0
    start = time.time()
    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device), target.to(device)
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += image.shape[0]
        loss_sum += loss.item() * image.shape[0]
        if i % print_freq == 0:
            totals = reduce_across_processes([loss_sum, seen])
            print(f"Epoch: [{epoch}] [{i}/{len(data_loader)}] loss {(totals[0] / totals[1]).item():.4f}")
    print(f"Epoch {epoch} took {datetime.timedelta(seconds=int(time.time() - start))}")


def evaluate(model, criterion, data_loader, device):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.inference_mode():
        for image, target in data_loader:
            image, target = image.to(device), target.to(device)
            output = model(image)
            loss_sum += criterion(output, target).item() * image.shape[0]
            correct += (output.argmax(dim=1) == target).sum().item()
            total += image.shape[0]
    stats = reduce_across_processes([correct, total, loss_sum])
    acc1 = 100.0 * stats[0].item() / stats[1].item()
    print(f"Test: Acc@1 {acc1:.3f} loss {stats[2].item() / stats[1].item():.4f}")
    return acc1


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 8, 8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def main(args):
    init_distributed_mode(args)
    device = torch.device(f"cuda:{args.gpu}" if torch.cuda.is_available() and args.distributed else "cpu")
    dataset, dataset_test = make_data(1024, 0), make_data(256, 1)
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
        test_sampler = torch.utils.data.distributed.DistributedSampler(dataset_test, shuffle=False)
    else:
        train_sampler = torch.utils.data.RandomSampler(dataset)
        test_sampler = torch.utils.data.SequentialSampler(dataset_test)
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler)
    data_loader_test = torch.utils.data.DataLoader(dataset_test, batch_size=args.batch_size, sampler=test_sampler)

    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu] if torch.cuda.is_available() else None)
        model_without_ddp = model.module

    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
        model_without_ddp.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        args.start_epoch = checkpoint["epoch"] + 1

    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args.print_freq)
        evaluate(model, criterion, data_loader_test, device)
        if args.output_dir:
            checkpoint = {
                "model": model.state_dict(),  # expect: ORK106
                "optimizer": optimizer.state_dict(),
                "epoch": epoch,
                "args": vars(args),
            }
            save_on_master(checkpoint, os.path.join(args.output_dir, f"model_{epoch}.pth"))
            save_on_master(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Classification Training")
    parser.add_argument("--batch-size", default=32, type=int)
    parser.add_argument("--epochs", default=90, type=int)
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--print-freq", default=10, type=int)
    parser.add_argument("--output-dir", default=".", type=str)
    parser.add_argument("--resume", default="", type=str)
    parser.add_argument("--start-epoch", default=0, type=int)
    return parser


if __name__ == "__main__":
    main(get_args_parser().parse_args())
