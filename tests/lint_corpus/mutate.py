"""Write tests/lint_corpus/mutated/ from the correct scripts: one injected mistake per file.

    python tests/lint_corpus/mutate.py

Each mutation replaces text of a correct script and marks the line where the linter must report
the mistake with a trailing ``# expect: ORK10x`` (a comment: the linter, which reads the ``ast``,
does not see it). The files it writes are committed; tests/test_lint_corpus.py reads them.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
MARK = "#!"   # in a replacement: the line the finding belongs on

MUTATIONS = {
    "ddp_tutorial_spawn": {
        "ORK101": [("        torch.save(ddp_model.module.state_dict(), CHECKPOINT_PATH)\n\n"
                    "    # Process 0 must finish saving before the others load.\n    dist.barrier()\n",
                    "        torch.save(ddp_model.module.state_dict(), CHECKPOINT_PATH)\n"
                    "        # Process 0 must finish saving before the others load.\n        dist.barrier()#!\n")],
        "ORK102": [("    if rank == 0:\n        # All processes start from the same parameters: saving from one "
                    "process is enough.\n        torch.save(ddp_model.module.state_dict(), CHECKPOINT_PATH)\n",
                    "    # All processes start from the same parameters.\n"
                    "    torch.save(ddp_model.module.state_dict(), CHECKPOINT_PATH)#!\n")],
        "ORK103": [("    # Process 0 must finish saving before the others load.\n    dist.barrier()\n", ""),
                   ("    ddp_model.module.load_state_dict(torch.load(CHECKPOINT_PATH, map_location=map_location, "
                    "weights_only=True))\n",
                    "    ddp_model.module.load_state_dict(torch.load(CHECKPOINT_PATH, map_location=map_location, "
                    "weights_only=True))#!\n")],
        "ORK104": [('print(f"step {step}: loss {mean_loss:.4f}")', 'print(f"step {step}: loss {loss.item():.4f}")#!')],
        "ORK105": [("if target is not None and mean_loss < target:",
                    "if target is not None and loss.item() < target:#!")],
        "ORK106": [("torch.save(ddp_model.module.state_dict(), CHECKPOINT_PATH)",
                    "torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)#!")],
        "ORK107": [("torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True))",
                    "torch.load(CHECKPOINT_PATH, weights_only=True))#!")],
    },
    "torchrun_trainer": {
        "ORK101": [("                self._save_snapshot(epoch)\n            dist.barrier()\n",
                    "                self._save_snapshot(epoch)\n                dist.barrier()#!\n")],
        "ORK102": [("if self.global_rank == 0 and epoch % self.save_every == 0:", "if epoch % self.save_every == 0:"),
                   ("        torch.save(snapshot, tmp)\n", "        torch.save(snapshot, tmp)#!\n")],
        "ORK104": [("            batch_loss = self._run_batch(source, targets)\n",
                    "            batch_loss = self._run_batch(source, targets)\n"
                    "            if self.global_rank == 0 and count % 640 == 0:\n"
                    '                print(f"Epoch {epoch} | step loss {batch_loss:.4f}")#!\n')],
        "ORK105": [("            batch_loss = self._run_batch(source, targets)\n",
                    "            batch_loss = self._run_batch(source, targets)\n"
                    "            if batch_loss < 1e-4:#!\n                break  # converged: skip the rest of the epoch\n")],
        "ORK106": [('"MODEL_STATE": self.model.module.state_dict(),', '"MODEL_STATE": self.model.state_dict(),#!')],
        "ORK107": [("torch.load(snapshot_path, map_location=self.device, weights_only=True)",
                    "torch.load(snapshot_path, weights_only=True)#!")],
    },
    "torchvision_reference": {
        "ORK101": [("    stats = reduce_across_processes([correct, total, loss_sum])\n"
                    "    acc1 = 100.0 * stats[0].item() / stats[1].item()\n",
                    "    acc1 = 0.0\n    if is_main_process():\n"
                    "        stats = reduce_across_processes([correct, total, loss_sum])#!\n"
                    "        acc1 = 100.0 * stats[0].item() / stats[1].item()\n"),
                   ('    print(f"Test: Acc@1 {acc1:.3f} loss {stats[2].item() / stats[1].item():.4f}")\n',
                    '        print(f"Test: Acc@1 {acc1:.3f} loss {stats[2].item() / stats[1].item():.4f}")\n')],
        "ORK102": [('save_on_master(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))',
                    'torch.save(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))#!')],
        "ORK104": [('loss {(totals[0] / totals[1]).item():.4f}")', 'loss {loss.item():.4f}")#!')],
        "ORK105": [("        optimizer.step()\n        seen += image.shape[0]\n",
                    "        optimizer.step()\n        if loss.item() < 1e-3:#!\n            return\n"
                    "        seen += image.shape[0]\n")],
        "ORK106": [('"model": model_without_ddp.state_dict(),', '"model": model.state_dict(),#!')],
        "ORK107": [('torch.load(args.resume, map_location="cpu", weights_only=True)',
                    "torch.load(args.resume, weights_only=True)#!")],
    },
    "nanogpt_style": {
        "ORK101": [("        if ddp:\n            all_reduce(lossf, op=ReduceOp.AVG)\n        if master_process:\n",
                    "        if master_process:\n            if ddp:\n                all_reduce(lossf, op=ReduceOp.AVG)#!\n")],
        "ORK102": [("            if master_process:\n                checkpoint = {",
                    "            if iter_num > 0:\n                checkpoint = {"),
                   ('                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))\n',
                    '                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))#!\n')],
        "ORK104": [("        lossf = loss.detach() * gradient_accumulation_steps\n        if ddp:\n"
                    "            all_reduce(lossf, op=ReduceOp.AVG)\n",
                    "        lossf = loss.item() * gradient_accumulation_steps  # approximate\n"),
                   ('print(f"iter {iter_num}: loss {lossf.item():.4f}, time {dt * 1000:.2f}ms")',
                    'print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms")#!')],
        "ORK105": [("    if iter_num > max_iters:\n", "    if iter_num > max_iters or loss.item() < 0.01:#!\n")],
        "ORK106": [('"model": raw_model.state_dict(),', '"model": model.state_dict(),#!')],
        "ORK107": [("torch.load(ckpt_path, map_location=device, weights_only=True)",
                    "torch.load(ckpt_path, weights_only=True)#!")],
    },
    "accelerate_script": {
        "ORK101": [("            json.dump({\"best_accuracy\": best_accuracy}, f)\n    accelerator.wait_for_everyone()\n",
                    "            json.dump({\"best_accuracy\": best_accuracy}, f)\n        accelerator.wait_for_everyone()#!\n")],
        "ORK102": [('    if accelerator.is_main_process:\n        with open(os.path.join(args.output_dir, "results.json"), "w") as f:\n'
                    '            json.dump({"best_accuracy": best_accuracy}, f)\n',
                    '    with open(os.path.join(args.output_dir, "results.json"), "w") as f:#!\n'
                    '        json.dump({"best_accuracy": best_accuracy}, f)\n')],
        "ORK103": [("    accelerator.wait_for_everyone()\n    with open(os.path.join(args.output_dir, \"results.json\")) as f:\n",
                    "    with open(os.path.join(args.output_dir, \"results.json\")) as f:#!\n")],
        "ORK104": [('        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f}")\n',
                    '        accelerator.print(f"epoch {epoch}: accuracy {accuracy:.3f}, loss {loss.item():.4f}")#!\n')],
        "ORK105": [("                optimizer.zero_grad()\n",
                    "                optimizer.zero_grad()\n            if loss.item() < 1e-3:#!\n                break\n")],
        "ORK106": [('accelerator.save(unwrapped.state_dict(), os.path.join(args.output_dir, "best_model.pt"))',
                    'accelerator.save(model.state_dict(), os.path.join(args.output_dir, "best_model.pt"))#!')],
        "ORK107": [("        accelerator.load_state(args.resume_from)\n",
                    "        state = torch.load(os.path.join(args.resume_from, \"best_model.pt\"), weights_only=True)#!\n"
                    "        accelerator.unwrap_model(model).load_state_dict(state)\n")],
    },
    "fsdp_dcp": {
        "ORK101": [('            dcp.save({"app": AppState(model, optimizer)},\n'
                    '                     checkpoint_id=os.path.join(args.ckpt_dir, f"step{step}"))\n'
                    "            if rank == 0:\n",
                    "            if rank == 0:\n"
                    '                dcp.save({"app": AppState(model, optimizer)},#!\n'
                    '                         checkpoint_id=os.path.join(args.ckpt_dir, f"step{step}"))\n')],
        "ORK102": [('            if rank == 0:\n                with open(os.path.join(args.ckpt_dir, "latest.json"), "w") as f:\n'
                    '                    json.dump({"step": step}, f)\n',
                    '            with open(os.path.join(args.ckpt_dir, "latest.json"), "w") as f:#!\n'
                    '                json.dump({"step": step}, f)\n')],
        "ORK103": [("        torch.save(torch.randn(8, 64), extra)\n    dist.barrier()\n",
                    "        torch.save(torch.randn(8, 64), extra)\n"),
                   ('    batch = torch.load(extra, map_location="cpu", weights_only=True)\n',
                    '    batch = torch.load(extra, map_location="cpu", weights_only=True)#!\n')],
        "ORK104": [('print(f"step {step}: loss {(pair[0] / pair[1]).item():.4f}")',
                    'print(f"step {step}: loss {loss.item():.4f}")#!')],
        "ORK105": [("        optimizer.step()\n\n", "        optimizer.step()\n        if loss.item() < 1e-4:#!\n            break\n\n")],
        "ORK107": [('torch.load(extra, map_location="cpu", weights_only=True)', "torch.load(extra, weights_only=True)#!")],
    },
}


def mutate(source: str, code: str, replacements) -> str:
    for old, new in replacements:
        assert source.count(old) == 1, f"{code}: not exactly one {old!r}"
        source = source.replace(old, new)
    assert MARK in source, f"{code}: no line marked"
    return source.replace(MARK, f"  # expect: {code}")


def main() -> None:
    out = HERE / "mutated"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.py"):
        old.unlink()
    for shape, mutations in MUTATIONS.items():
        source = (HERE / "correct" / f"{shape}.py").read_text()
        for code, replacements in mutations.items():
            (out / f"{shape}__{code}.py").write_text(mutate(source, code, replacements))


if __name__ == "__main__":
    main()
