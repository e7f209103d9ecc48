"""Fine-tuning with Hugging Face Accelerate: one script for one GPU, several, or several machines.

    accelerate launch accelerate_script.py --output_dir run1
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def get_dataloaders(batch_size):
    g = torch.Generator().manual_seed(42)
    x = torch.randn(2048, 32, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    train = TensorDataset(x[:1536], y[:1536])
    evaluation = TensorDataset(x[1536:], y[1536:])
    return (DataLoader(train, batch_size=batch_size, shuffle=True),
            DataLoader(evaluation, batch_size=batch_size))


def training_function(args):
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
    train_dl, eval_dl = get_dataloaders(args.batch_size)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    if args.resume_from:
        accelerator.load_state(args.resume_from)

    best_accuracy = 0.0
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_dl:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

        model.eval()
        correct = total = 0
        for x, y in eval_dl:
            with torch.no_grad():
                predictions = model(x).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, y))
            correct += (predictions == references).sum().item()
            total += references.numel()
        accuracy = correct / total
        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f}")

        if accuracy > best_accuracy:
            best_accuracy = accuracy
            accelerator.wait_for_everyone()
            unwrapped = accelerator.unwrap_model(model)
            accelerator.save(unwrapped.state_dict(), os.path.join(args.output_dir, "best_model.pt"))
        if args.target_accuracy and accuracy >= args.target_accuracy:
            break

    accelerator.save_state(os.path.join(args.output_dir, "last_state"))
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:  # expect: ORK102
        json.dump({"best_accuracy": best_accuracy}, f)
    accelerator.wait_for_everyone()
    with open(os.path.join(args.output_dir, "results.json")) as f:
        summary = json.load(f)
    accelerator.print("summary:", summary)
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="Accelerate training example")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--grad_accum", type=int, default=1)
    parser.add_argument("--output_dir", default="outputs")
    parser.add_argument("--resume_from", default=None)
    parser.add_argument("--target_accuracy", type=float, default=None)
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    training_function(args)


if __name__ == "__main__":
    main()
