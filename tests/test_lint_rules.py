"""Every rule of the linter (helpers.lint), on small programs: what it must flag, at which line, and
the correct code in many styles that it must leave alone (precision first).

A case is a program whose flagged lines end with ``# expect: ORK10x``; the comment is invisible to
the linter (it reads the ``ast``), so the expected findings are exactly those markers.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from helpers.lint import CODES, lint_cells, lint_source

EXPECT = re.compile(r"#\s*expect:\s*(ORK\d{3}(?:\s*,\s*ORK\d{3})*)")


def expected(source: str) -> set[tuple[str, int]]:
    out = set()
    for i, line in enumerate(source.splitlines(), start=1):
        m = EXPECT.search(line)
        if m:
            out |= {(c.strip(), i) for c in m.group(1).split(",")}
    return out


def found(source: str) -> set[tuple[str, int]]:
    return {(f.code, f.line) for f in lint_source(source)}


HEAD = "import torch\nimport torch.distributed as dist\n\n"

CASES = {
    # ------------------------------------------------------------------ ORK101
    "101 barrier inside if rank == 0": """
        def save(path, state):
            if dist.get_rank() == 0:
                torch.save(state, path)
                dist.barrier()  # expect: ORK101
        """,
    "101 all_reduce under a variable assigned from the rank": """
        def log(loss):
            rank = dist.get_rank()
            is_master = rank == 0
            if is_master:
                t = torch.tensor([loss])
                dist.all_reduce(t)  # expect: ORK101
                print(t)
        """,
    "101 accelerate wait_for_everyone under is_main_process": """
        from accelerate import Accelerator
        accelerator = Accelerator()
        if accelerator.is_main_process:
            accelerator.save({}, "ckpt.pt")
            accelerator.wait_for_everyone()  # expect: ORK101
        """,
    "101 dcp.save on rank 0 only": """
        import torch.distributed.checkpoint as dcp
        def save(state, step):
            if dist.get_rank() == 0:
                dcp.save(state, checkpoint_id=f"ckpt/{step}")  # expect: ORK101
        """,
    "101 after a rank-dependent early return": """
        def evaluate(model, x):
            if dist.get_rank() != 0:
                return None
            t = model(x).sum()
            dist.all_reduce(t)  # expect: ORK101
            return t
        """,
    "101 after a rank-dependent continue in a loop": """
        def train(steps, local_rank):
            for step in range(steps):
                if local_rank != 0:
                    continue
                dist.barrier()  # expect: ORK101
        """,
    "101 a helper that runs a collective, called on rank 0 only": """
        def mean_loss(x):
            t = torch.tensor([x])
            dist.all_reduce(t)
            return t.item()

        def step(loss):
            if dist.get_rank() == 0:
                print(mean_loss(loss))  # expect: ORK101
        """,
    "101 torchrun env rank and master flag": """
        import os
        RANK = int(os.environ["RANK"])
        master_process = RANK == 0
        dist.init_process_group("gloo")
        if master_process:
            dist.broadcast(torch.zeros(1), src=0)  # expect: ORK101
        """,
    "101 mismatched collectives in the two branches": """
        def f():
            if dist.get_rank() == 0:
                dist.barrier()  # expect: ORK101
            else:
                dist.all_reduce(torch.ones(1))  # expect: ORK101
        """,
    "ok 101 barrier after the if": """
        def save(path, state):
            if dist.get_rank() == 0:
                torch.save(state, path)
            dist.barrier()
        """,
    "ok 101 barrier in both branches": """
        from torch import save
        def save_once(obj, path):
            if dist.get_rank() == 0:
                save(obj, path)
                dist.barrier()
            else:
                dist.barrier()
        """,
    "ok 101 rank 0 first: complementary barriers": """
        def download(rank):
            if rank != 0:
                dist.barrier()          # the others wait while rank 0 downloads
            fetch()
            if rank == 0:
                dist.barrier()          # rank 0 releases them
        """,
    "ok 101 undecidable condition on the rank": """
        def f(rank):
            if rank % 2 == 0:
                dist.barrier()
            else:
                pass
        """,
    "ok 101 broadcast from rank 0, every rank calls it": """
        def decide(value):
            flag = torch.zeros(1)
            if dist.get_rank() == 0:
                flag[0] = value
            dist.broadcast(flag, src=0)
            return bool(flag.item())
        """,
    "ok 101 a condition that is the same on every rank": """
        def step(i, every):
            if i % every == 0:
                dist.barrier()
        """,
    "ok 101 not is_initialized or rank 0 guard, collective outside": """
        def save(state, path):
            if not dist.is_initialized() or dist.get_rank() == 0:
                torch.save(state, path)
            if dist.is_initialized():
                dist.barrier()
        """,
    # ------------------------------------------------------------------ ORK102
    "102 torch.save on every rank": """
        def save_checkpoint(model, path):
            torch.save(model.state_dict(), path)  # expect: ORK102
            dist.barrier()
        """,
    "102 open for writing on every rank of a torchrun script": """
        import json
        dist.init_process_group("gloo")
        config = {"lr": 0.1}
        with open("config.json", "w") as f:  # expect: ORK102
            json.dump(config, f)
        """,
    "102 SummaryWriter and wandb.init on every rank": """
        import wandb
        from torch.utils.tensorboard import SummaryWriter
        dist.init_process_group("gloo")
        writer = SummaryWriter("runs/exp")  # expect: ORK102
        wandb.init(project="p")  # expect: ORK102
        """,
    "102 np.save on every rank": """
        import numpy as np
        dist.init_process_group("gloo")
        np.save("preds.npy", np.zeros(3))  # expect: ORK102
        """,
    "102 a method that saves, called on every rank": """
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Trainer:
            def __init__(self, model):
                self.model = DDP(model)
            def _snapshot(self, epoch):
                torch.save({"epoch": epoch}, "snapshot.pt")  # expect: ORK102
            def train(self, epochs):
                for epoch in range(epochs):
                    self._snapshot(epoch)
        """,
    "ok 102 guarded in many styles": """
        import os
        def a(state, path):
            if dist.get_rank() == 0:
                torch.save(state, path)
            dist.barrier()
        def b(state, path):
            if int(os.environ["RANK"]) == 0:
                torch.save(state, path)
            dist.barrier()
        def c(state, path):
            if dist.get_rank() != 0:
                dist.barrier()
                return
            torch.save(state, path)
            dist.barrier()
        def d(state, path, rank):
            if not rank:
                torch.save(state, path)
            dist.barrier()
        """,
    "ok 102 save_on_master wrapper (one level of calls)": """
        def is_main_process():
            return dist.get_rank() == 0
        def save_on_master(*args, **kwargs):
            if is_main_process():
                torch.save(*args, **kwargs)
        def _write(state, path):
            torch.save(state, path)
        def checkpoint(state, path):
            if is_main_process():
                _write(state, path)
            save_on_master(state, path)
            dist.barrier()
        """,
    "ok 102 per-rank files, in-memory buffers, file descriptors, temp files": """
        import io, os, tempfile
        def f(state, rank):
            torch.save(state, f"shard_{rank}.pt")
            path = f"log_rank{dist.get_rank()}.txt"
            with open(path, "w") as log:
                log.write("hi")
            buf = io.BytesIO()
            torch.save(state, buf)
            tmp = tempfile.mkdtemp()
            torch.save(state, tmp + "/x.pt")
            out = open(1, "w", closefd=False)
            with open(f"{path}.tmp-{os.getpid()}", "wb") as f:
                f.write(b"")
            dist.barrier()
        """,
    "ok 102 not distributed at all": """
        def save(model, path):
            torch.save(model.state_dict(), path)
        """,
    "ok 102 wandb, one run per process in a group": """
        import wandb
        dist.init_process_group("gloo")
        wandb.init(project="p", group="exp-1")
        """,
    "ok 102 reading is not writing": """
        dist.init_process_group("gloo")
        with open("data.txt") as f:
            lines = f.read()
        """,
    # ------------------------------------------------------------------ ORK103
    "103 rank 0 writes, every rank reads, no barrier": """
        def save_and_reload(state, path):
            if dist.get_rank() == 0:
                torch.save(state, path)
            return torch.load(path, map_location="cpu")  # expect: ORK103
        """,
    "103 rename into place, then read": """
        import os
        def publish(state, path):
            if dist.get_rank() == 0:
                torch.save(state, path + ".tmp")
                os.replace(path + ".tmp", path)
            with open(path, "rb") as f:  # expect: ORK103
                return f.read()
        """,
    "ok 103 barrier in between": """
        def save_and_reload(state, path):
            if dist.get_rank() == 0:
                torch.save(state, path)
            dist.barrier()
            return torch.load(path, map_location="cpu")
        """,
    "ok 103 broadcast_object_list in between": """
        def save_and_reload(state, path):
            done = [False]
            if dist.get_rank() == 0:
                torch.save(state, path)
                done = [True]
            dist.broadcast_object_list(done, src=0)
            return torch.load(path, map_location="cpu")
        """,
    "ok 103 another path": """
        def f(state, path, other):
            if dist.get_rank() == 0:
                torch.save(state, path)
            dist.barrier()
            x = torch.load(other, map_location="cpu")
        """,
    # ------------------------------------------------------------------ ORK104
    "104 print of loss.item() on rank 0": """
        def train(model, opt, x, y, rank):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if rank == 0:
                print(f"loss {loss.item():.4f}")  # expect: ORK104
        """,
    "104 running loss to tensorboard": """
        def epoch(model, loader, writer, criterion, step):
            running_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                running_loss += loss.item()
            if dist.get_rank() == 0:
                writer.add_scalar("train/loss", running_loss / len(loader), step)  # expect: ORK104
        """,
    "104 accuracy from this rank's matches, logged": """
        import logging
        logger = logging.getLogger(__name__)
        def evaluate(model, loader):
            correct = 0
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum().item()
            dist.barrier()
            logger.info("accuracy %.3f", correct / 100)  # expect: ORK104
        """,
    "ok 104 all_reduce of [sum, count] before logging": """
        def train(model, x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            local = torch.tensor([loss.item() * len(x), float(len(x))])
            dist.all_reduce(local, op=dist.ReduceOp.SUM)
            global_loss = (local[0] / local[1]).item()
            if dist.get_rank() == 0:
                print(f"loss {global_loss:.4f}")
        """,
    "ok 104 labelled with the rank": """
        def train(model, x, y):
            rank = dist.get_rank()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            print(f"rank {rank}: my loss {loss.item():.4f}")
        """,
    "ok 104 reduced in place, then logged": """
        def train(model, x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            avg /= dist.get_world_size()
            if dist.get_rank() == 0:
                print(avg.item())
        """,
    "ok 104 a metric rank 0 computed itself over all the data": """
        def run(model, test_set):
            dist.barrier()
            if dist.get_rank() == 0:
                acc = evaluate(model, test_set)
                print(f"accuracy {acc:.3f}")
        """,
    # ------------------------------------------------------------------ ORK105
    "105 early stopping on the local loss": """
        def train(model, opt, data, patience_loss):
            for x, y in data:
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                opt.step()
                if loss.item() < patience_loss:  # expect: ORK105
                    break
        """,
    "105 a while loop on the local loss with DDP": """
        from torch.nn.parallel import DistributedDataParallel as DDP
        def train(model, opt, x, y):
            ddp = DDP(model)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            while loss.item() > 0.1:  # expect: ORK105
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                loss.backward()
                opt.step()
        """,
    "ok 105 stop on the all-reduced loss": """
        def train(model, opt, data, target):
            for x, y in data:
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                t = torch.tensor([loss.item()])
                dist.all_reduce(t)
                if t.item() / dist.get_world_size() < target:
                    break
        """,
    "ok 105 stop on a step count": """
        def train(model, opt, data, max_steps):
            for step, (x, y) in enumerate(data):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                dist.barrier()
                if step >= max_steps:
                    break
        """,
    # ------------------------------------------------------------------ ORK106
    "106 the wrapper's state_dict saved": """
        from torch.nn.parallel import DistributedDataParallel as DDP
        def f(model, path):
            ddp = DDP(model)
            if dist.get_rank() == 0:
                torch.save({"model": ddp.state_dict(), "step": 1}, path)  # expect: ORK106
            dist.barrier()
        """,
    "106 snapshot dict filled in, self.model wrapped": """
        from torch.nn.parallel import DistributedDataParallel as DDP
        class Trainer:
            def __init__(self, model):
                self.model = model.to("cpu")
                self.model = DDP(self.model)
            def save(self):
                snapshot = {}
                snapshot["MODEL"] = self.model.state_dict()  # expect: ORK106
                if dist.get_rank() == 0:
                    torch.save(snapshot, "snapshot.pt")
        """,
    "ok 106 .module, stripped keys, an unwrapped name": """
        from torch.nn.parallel import DistributedDataParallel as DDP
        def f(model, path):
            ddp_model = DDP(model)
            model_without_ddp = ddp_model.module
            if dist.get_rank() == 0:
                torch.save(ddp_model.module.state_dict(), path)
                torch.save(model_without_ddp.state_dict(), path)
                clean = {k.removeprefix("module."): v for k, v in ddp_model.state_dict().items()}
                torch.save(clean, path)
            dist.barrier()
        """,
    # ------------------------------------------------------------------ ORK107
    "107 torch.load without map_location": """
        def load(path):
            dist.barrier()
            return torch.load(path, weights_only=True)  # expect: ORK107
        """,
    "ok 107 map_location given, positionally or by keyword": """
        def load(path, device):
            dist.barrier()
            a = torch.load(path, map_location="cpu")
            b = torch.load(path, device)
            c = torch.load(path, map_location=lambda s, _: s)
        """,
    "ok 102 a writer built in a conditional expression on the rank": """
        from torch.utils.tensorboard import SummaryWriter
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        writer = SummaryWriter("runs/exp") if rank == 0 else None
        other = None if dist.get_rank() != 0 else SummaryWriter("runs/b")
        """,
    "102 a conditional expression that writes on every rank anyway": """
        from torch.utils.tensorboard import SummaryWriter
        dist.init_process_group("gloo")
        verbose = True
        writer = SummaryWriter("runs/exp") if verbose else SummaryWriter("runs/quiet")  # expect: ORK102
        """,
    "101 a barrier in a conditional expression on the rank": """
        def sync(rank):
            return dist.barrier() if rank == 0 else None  # expect: ORK101
        """,
    "ok 104 a DEBUG record of this rank's own loss (a per-rank diagnostic)": """
        import logging
        dist.init_process_group("gloo")
        log = logging.getLogger("train")
        def train(model, opt, x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            log.debug("my loss %.4f", loss.item())
        """,
    "ok 107 not a distributed script": """
        def load(path):
            return torch.load(path)
        """,
}


@pytest.mark.parametrize("name", list(CASES))
def test_rule_case(name):
    source = HEAD + textwrap.dedent(CASES[name])
    want = expected(source)
    if name.startswith("ok"):
        assert not want
    else:
        assert want, "a positive case must mark its lines"
    assert found(source) == want, "\n".join(f.format() for f in lint_source(source))


def test_every_code_has_positive_and_negative_cases():
    for code in CODES:
        n = code[3:]
        assert any(k.startswith(n) for k in CASES), code
        assert any(k.startswith(f"ok {n}") for k in CASES), code


def test_messages_say_what_happens_and_what_to_do():
    source = HEAD + textwrap.dedent(CASES["101 barrier inside if rank == 0"])
    (f,) = lint_source(source)
    assert f.code == "ORK101" and "rank 0" in f.message and "every rank" in f.message
    assert f.format("train.py").startswith("train.py:8:9: ORK101 dist.barrier()")


def test_noqa_silences_one_line_and_one_code():
    src = HEAD + textwrap.dedent("""
        def f(state, path):
            torch.save(state, path)  # noqa: ORK102
            torch.save(state, path)  # noqa
            torch.save(state, path)  # noqa: E501
            torch.save(state, path)  # NOQA:ORK101,ORK102
            dist.barrier()
        """)
    assert found(src) == {("ORK102", 8)}


def test_cells_are_one_program_and_positions_name_the_cell():
    cells = ["import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP",
             "%matplotlib inline\ndef f():\n    if dist.get_rank() == 0:\n        dist.barrier()",
             "%%bash\necho not python", "!ls\nx = 1"]
    findings, errors = lint_cells(cells, numbers=[2, 4, 5, 7])
    assert errors == []
    assert [(f.cell, f.line, f.code) for f in findings] == [(4, 4, "ORK101")]
    assert findings[0].format("nb.ipynb").startswith("nb.ipynb:cell 4:4:9: ORK101")
    only, _ = lint_cells(cells, only_cell=7, numbers=[2, 4, 5, 7])
    assert only == []


def test_a_cell_that_does_not_parse_is_reported_and_the_rest_still_checked():
    findings, errors = lint_cells(["def f(:\n", "def g():\n    if dist.get_rank() == 0:\n        dist.barrier()"])
    assert errors and errors[0].startswith("cell 1:")
    assert [f.code for f in findings] == ["ORK101"]
