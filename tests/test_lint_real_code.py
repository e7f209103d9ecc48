"""The analysis features real training scripts needed (issue 25), each on a small program in the
shape the public scripts have: the flagged lines end with ``# expect: ORK10x``."""

from __future__ import annotations

import textwrap

import pytest

from tests.test_lint_rules import expected, found

CASES = {
    # mp.spawn hands main the rank; Trainer's gpu_id is fed it: `self.gpu_id == 0` is a rank guard
    "rank-through-constructor-parameter": """
        import torch, torch.multiprocessing as mp
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Trainer:
            def __init__(self, model, gpu_id):
                self.gpu_id = gpu_id
                self.model = DDP(model, device_ids=[gpu_id])
            def _save(self):
                torch.save(self.model.module.state_dict(), "checkpoint.pt")
            def train(self, epochs):
                for epoch in range(epochs):
                    if self.gpu_id == 0:
                        self._save()
        def main(rank, world_size):
            torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
            Trainer(torch.nn.Linear(2, 2), rank).train(3)
        if __name__ == "__main__":
            mp.spawn(main, args=(2,), nprocs=2)
    """,
    "rank-guard-through-attribute-then-barrier-inside": """
        import os, torch, torch.distributed as dist
        class Trainer:
            def __init__(self):
                self.gpu_id = int(os.environ["LOCAL_RANK"])
            def train(self):
                if self.gpu_id == 0:
                    torch.save({}, "snapshot.pt")
                    dist.barrier()  # expect: ORK101
        dist.init_process_group("gloo")
        Trainer().train()
    """,
    "loop-variable-path": """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        for name in ("last.pt", "backup.pt"):
            torch.save({"step": 1}, name)  # expect: ORK102
    """,
    "loss-module-is-not-a-loss-value": """
        import torch, torch.nn as nn, torch.distributed as dist
        dist.init_process_group("gloo")
        loss_fn = nn.CrossEntropyLoss()
        print(f"criterion: {loss_fn}")
    """,
    "accelerator-is-not-a-metric-and-check-trigger-reduces": """
        from accelerate import Accelerator
        accelerator = Accelerator()
        for batch in range(10):
            loss = model(batch)
            accelerator.backward(loss)
            if loss.item() < 0.5:
                accelerator.set_trigger()
            if accelerator.check_trigger():
                break
            if loss.item() < 1e-3:  # expect: ORK105
                break
    """,
    "torch-gather-is-a-tensor-op": """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        for step in range(10):
            loss = model(step)
            loss.backward()
            picked_loss = torch.gather(loss, 0, index)
            if dist.get_rank() == 0:
                print(f"loss {picked_loss.item()}")  # expect: ORK104
    """,
    # minGPT-ddp's shape: the wrapper's state_dict goes into a dataclass, then asdict() before torch.save
    "wrapper-state-dict-through-dataclass-and-asdict": """
        import torch, torch.distributed as dist
        from dataclasses import dataclass, asdict
        from torch.nn.parallel import DistributedDataParallel as DDP
        @dataclass
        class Snapshot:
            model_state: dict
            finished_epoch: int
        class Trainer:
            def __init__(self, model, rank):
                self.rank = rank
                self.model = DDP(model)
            def save(self, epoch):
                snapshot = Snapshot(model_state=self.model.state_dict(), finished_epoch=epoch)  # expect: ORK106
                snapshot = asdict(snapshot)
                if dist.get_rank() == 0:
                    torch.save(snapshot, "snapshot.pt")
    """,
    "wrapper-state-dict-through-namedtuple-ordereddict-and-dict-copy": """
        import torch, collections, torch.distributed as dist
        from typing import NamedTuple
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Record(NamedTuple):
            weights: dict
            step: int
        def save(model, step):
            ddp = DDP(model)
            record = Record(ddp.state_dict(), step)  # expect: ORK106
            state = {"model": ddp.state_dict()}  # expect: ORK106
            if dist.get_rank() == 0:
                torch.save(record._asdict(), "record.pt")
                torch.save(collections.OrderedDict(model=ddp.state_dict()), "od.pt")  # expect: ORK106
                torch.save(dict(state), "copy.pt")
    """,
    # a loss module whose name says nothing: what it was built as makes its result a loss value
    "loss-module-call-is-a-loss-value-whatever-its-name": """
        import torch.nn as nn, torch.distributed as dist
        dist.init_process_group("gloo")
        ce = nn.CrossEntropyLoss()
        for step in range(10):
            value = ce(model(step), step)
            if dist.get_rank() == 0:
                print(f"step {step}: {value.item():.4f}")  # expect: ORK104
    """,
    # an estimate_* call is not exempted by its name: defined elsewhere, only its name is known (a loss)
    "estimate-call-is-not-exempted-by-its-name": """
        import torch.distributed as dist
        from evaluation import estimate_loss
        dist.init_process_group("gloo")
        losses = estimate_loss(model)
        if dist.get_rank() == 0:
            print(f"val loss {losses['val']:.4f}")  # expect: ORK104
    """,
    # a function of this file called sync_*: what it does (no collective) decides, not its name;
    # and Tensor.gather(dim, index) is a tensor op, not accelerate's gather
    "reduction-decided-by-what-the-function-does": """
        import torch.distributed as dist
        dist.init_process_group("gloo")
        def sync_loss(x):
            return x.detach()
        for step in range(10):
            loss = model(step)
            loss.backward()
            shown = sync_loss(loss)
            picked = loss.gather(0, index)
            if dist.get_rank() == 0:
                print(f"loss {shown.item()}")  # expect: ORK104
                print(f"loss {picked.item()}")  # expect: ORK104
    """,
    # the object called `accelerator` is an instance of a class of this file: its gather is that class's
    # method (which combines nothing), not accelerate's collective
    "accelerator-decided-by-what-it-is-and-methods-of-file-classes-followed": """
        from accelerate import Accelerator
        class Accel:
            def gather(self, x):
                return x
        acc = Accelerator()
        accelerator = Accel()
        for batch in range(10):
            loss = model(batch)
            acc.backward(loss)
            shown = accelerator.gather(loss)
            if acc.is_main_process:
                print(f"loss {shown.item()}")  # expect: ORK104
    """,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_code_shapes(name):
    source = textwrap.dedent(CASES[name])
    assert found(source) == expected(source)


def test_an_ork101_finding_names_the_line_of_the_guard_it_reasons_from():
    from helpers.lint import lint_source

    source = textwrap.dedent("""
        import torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            print("saving")
            dist.barrier()
    """)
    (f,) = lint_source(source)
    assert f.code == "ORK101" and f.line == 6
    assert "the branch on the rank at line 4" in f.message and "move it after the if block" in f.message


def test_ork104_to_106_findings_name_the_line_they_reason_from():
    from helpers.lint import lint_source

    source = textwrap.dedent("""
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(net)
        for step in range(10):
            loss = model(step)
            loss.backward()
            if dist.get_rank() == 0:
                print(f"loss {loss.item()}")
            if loss.item() < 0.1:
                break
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), "m.pt")
    """)
    msgs = {f.code: f.message for f in lint_source(source)}
    assert set(msgs) == {"ORK104", "ORK105", "ORK106"}, msgs
    assert "logs `loss`, this rank's own value (set at line 7 and never all-reduced)" in msgs["ORK104"]
    assert "stops on `loss`, this rank's own value (set at line 7 and never all-reduced)" in msgs["ORK105"]
    assert "saves model.state_dict() of the DDP wrapper made at line 5" in msgs["ORK106"]


def test_an_ork101_finding_after_an_early_return_names_the_line_of_the_if_that_returns():
    from helpers.lint import lint_source

    source = textwrap.dedent("""
        import torch.distributed as dist
        dist.init_process_group("gloo")
        def evaluate(t):
            if dist.get_rank() != 0:
                return
            dist.all_reduce(t)
        evaluate(x)
    """)
    (f,) = lint_source(source)
    assert f.code == "ORK101" and f.line == 7
    assert "comes after a `return` that depends on the rank (the if at line 5)" in f.message
