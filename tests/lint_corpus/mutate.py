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


# ------------------------------------------------------------------ mutations found by the ast
#
# ``inject(source)`` makes mutants of any training script, with no hand-written text: it finds
# sites by the ast (the statement that runs the backward pass inside a loop, the `if` blocks on
# the rank, the saves and loads, the collectives, the DDP wrapper) and writes each rule's
# mistake there in several forms, the way people write them. Each mutant has one mistake and the
# line where the linter must report it. Used for the public corpus (tests/lint_corpus/public.py)
# and the committed scripts alike, in memory: nothing is written to disk.

import ast  # noqa: E402
import re  # noqa: E402
from typing import NamedTuple  # noqa: E402

RANK_TEST = re.compile(r"rank|master|main_process|is_main|gpu_id|global_zero|is_rank_zero|process_index")
COLLECTIVE_CALLS = {"all_reduce", "barrier", "wait_for_everyone", "all_gather", "broadcast", "reduce",
                    "all_gather_object", "broadcast_object_list"}


class Mutant(NamedTuple):
    code: str      # the rule whose mistake it is
    form: str      # which way of writing it
    line: int      # where the linter must report it
    source: str


def _parents(tree):
    out = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            out[id(c)] = n
    return out


def _chain(node, parents):
    while id(node) in parents:
        node = parents[id(node)]
        yield node


def _func_of(node, parents):
    return next((p for p in _chain(node, parents) if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))), None)


def _in_loop(node, parents):
    for p in _chain(node, parents):
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None
        if isinstance(p, (ast.For, ast.While, ast.AsyncFor)):
            return p
    return None


def _rank_if(node) -> bool:
    if not isinstance(node, ast.If):
        return False
    t = ast.unparse(node.test)
    return bool(RANK_TEST.search(t)) and "world" not in t and "size" not in t


def _guard_of(node, parents):
    """The nearest enclosing rank `if` whose body (not else) holds ``node``."""
    child = node
    for p in _chain(node, parents):
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return None
        if _rank_if(p) and any(child is s for s in p.body):
            return p
        child = p
    return None


class _Script:
    def __init__(self, source: str):
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.tree = ast.parse(source)
        self.parents = _parents(self.tree)
        self.dist = self._dist_alias()
        self.accelerator = self._accelerator_name()

    def _dist_alias(self) -> str:
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.name == "torch.distributed" and a.asname:
                        return a.asname
            if isinstance(n, ast.ImportFrom) and n.module == "torch" and not n.level:
                for a in n.names:
                    if a.name == "distributed":
                        return a.asname or a.name
        return "torch.distributed"

    def _accelerator_name(self) -> str | None:
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and \
                    (ast.unparse(n.value.func).split(".")[-1] == "Accelerator") and \
                    isinstance(n.targets[0], (ast.Name, ast.Attribute)):
                return ast.unparse(n.targets[0])
        return None

    def starts_line(self, st) -> bool:
        line = self.lines[st.lineno - 1]
        return line[:st.col_offset].strip() == "" and ";" not in line

    def indent(self, st) -> str:
        return self.lines[st.lineno - 1][:st.col_offset]

    def edit(self, start: int, end: int, new: list[str], mark: int, code: str, form: str) -> Mutant:
        """Replace lines start..end (1-based, inclusive; end = start - 1 inserts) with ``new``;
        ``mark`` is the index in ``new`` of the line the finding belongs on."""
        new = [ln if ln.endswith("\n") else ln + "\n" for ln in new]
        lines = self.lines[:start - 1] + new + self.lines[end:]
        line = start + mark
        lines[line - 1] = lines[line - 1].rstrip("\n") + f"  # expect: {code}\n"
        return Mutant(code, form, line, "".join(lines))

    RECORD = ["from dataclasses import asdict, dataclass\n", "\n", "\n", "@dataclass\n",
              "class FinalCheckpoint:\n", "    model_state: dict\n", "    step: int\n", "\n"]

    def with_record(self, m: Mutant) -> Mutant | None:
        """``m`` with a dataclass FinalCheckpoint declared after the script's last top-level import."""
        imports = [n for n in self.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        if not imports or imports[-1].end_lineno >= m.line:
            return None
        at = imports[-1].end_lineno
        lines = m.source.splitlines(keepends=True)
        return m._replace(line=m.line + len(self.RECORD), source="".join(lines[:at] + self.RECORD + lines[at:]))

    def after(self, st, new, mark, code, form):
        return self.edit(st.end_lineno + 1, st.end_lineno, new, mark, code, form)

    def before(self, st, new, mark, code, form):
        return self.edit(st.lineno, st.lineno - 1, new, mark, code, form)

    # -- sites
    def backward_sites(self):
        """(statement, loss name, loop) of each `loss.backward()`-like statement inside a loop."""
        out = []
        for st in ast.walk(self.tree):
            if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and self.starts_line(st)):
                continue
            f = st.value.func
            if not (isinstance(f, ast.Attribute) and f.attr == "backward"):
                continue
            if st.value.args and isinstance(st.value.args[0], ast.Name):
                loss = st.value.args[0].id                # accelerator.backward(loss)
            elif isinstance(f.value, ast.Name):
                loss = f.value.id
            elif isinstance(f.value, ast.Call) and f.value.args and isinstance(f.value.args[0], ast.Name):
                loss = f.value.args[0].id                 # scaler.scale(loss).backward()
            elif st.value.args and isinstance(st.value.args[0], ast.Name):
                loss = st.value.args[0].id                # accelerator.backward(loss)
            else:
                continue
            loop = _in_loop(st, self.parents)
            if loop is None:          # a step method the training loop calls: its body is the site
                fn = _func_of(st, self.parents)
                if fn is None or fn.name not in self.called_in_loops():
                    continue
                loop = fn
            out.append((st, loss, loop))
        return out

    def called_in_loops(self) -> set[str]:
        names = set()
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Call) and _in_loop(n, self.parents) is not None:
                f = n.func
                names.add(f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "")
        return names

    def rank_ifs(self, within=None):
        ifs = [n for n in ast.walk(self.tree) if _rank_if(n) and self.starts_line(n)
               and self.lines[n.lineno - 1].rstrip().endswith(":")]
        if within is not None:
            ifs = [n for n in ifs if _func_of(n, self.parents) is within]
        return sorted(ifs, key=lambda n: n.lineno)

    def guard_text(self, site) -> str | None:
        fn = _func_of(site, self.parents)
        for g in self.rank_ifs():
            if _func_of(g, self.parents) is fn and g.lineno < site.lineno and isinstance(g.test, ast.Compare | ast.Name | ast.Attribute | ast.Call | ast.UnaryOp):
                return ast.unparse(g.test)
        return None

    def calls(self, pred):
        return sorted((n for n in ast.walk(self.tree) if isinstance(n, ast.Call) and pred(n)),
                      key=lambda n: (n.lineno, n.col_offset))

    def statement_of(self, node):
        for p in [node, *_chain(node, self.parents)]:
            if isinstance(p, ast.stmt):
                return p
        return None

    def ddp_names(self) -> list[str]:
        out = []
        for n in ast.walk(self.tree):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call):
                callee = ast.unparse(n.value.func).split(".")[-1]
                t = n.targets[0]
                if callee in ("DDP", "DistributedDataParallel") and isinstance(t, (ast.Name, ast.Attribute)):
                    out.append(ast.unparse(t))
                elif callee == "prepare" and isinstance(t, ast.Tuple) and t.elts and \
                        isinstance(t.elts[0], (ast.Name, ast.Attribute)) and "model" in ast.unparse(t.elts[0]):
                    out.append(ast.unparse(t.elts[0]))
        return out


def _collective_name(call) -> str | None:
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return name if name in COLLECTIVE_CALLS else None


def _is_save(call) -> bool:
    return ast.unparse(call.func) in ("torch.save",) or (
        isinstance(call.func, ast.Attribute) and call.func.attr == "save" and "accelerator" in ast.unparse(call.func.value))


def _first(items, n=1):
    return list(items)[:n]


def inject(source: str) -> list[Mutant]:
    """Every mutant this script allows: each rule's mistake in each form, at the first sensible site."""
    if not re.search(r"torch\.distributed|init_process_group|DistributedDataParallel|\bDDP\(|Accelerator\(|"
                     r"fully_shard|FSDP\(", source):
        return []          # a single-process script: a rank's own value is the run's, nothing to inject
    s = _Script(source)
    out: list[Mutant] = []
    d = s.dist
    barrier = f"{s.accelerator}.wait_for_everyone()" if s.accelerator else f"{d}.barrier()"
    backward = s.backward_sites()
    ifs = s.rank_ifs()

    def add(fn, *args):
        try:
            m = fn(*args)
        except (IndexError, ValueError, SyntaxError):
            return
        if m is not None:
            ast.parse(m.source)
            out.append(m)

    # ORK101: a collective only some ranks reach
    for g in _first(ifs):
        last = g.body[-1]
        add(s.after, last, [s.indent(last) + f"{barrier}  # wait for rank 0"], 0, "ORK101", "barrier-in-guard")
    colls = [c for c in s.calls(_collective_name) if s.statement_of(c) is not None]
    colls = [c for c in colls if isinstance(s.statement_of(c), ast.Expr) and s.starts_line(s.statement_of(c))
             and s.statement_of(c).lineno == s.statement_of(c).end_lineno
             and _guard_of(c, s.parents) is None]
    for c in _first(colls):
        st = s.statement_of(c)
        guard = s.guard_text(st) or f"{d}.get_rank() == 0"
        ind = s.indent(st)
        add(s.edit, st.lineno, st.end_lineno, [f"{ind}if {guard}:", "    " + s.lines[st.lineno - 1]], 1,
            "ORK101", "collective-moved-into-guard")
    for c in _first([c for c in colls if _func_of(c, s.parents) is not None
                     and _in_loop(c, s.parents) is None]):
        st = s.statement_of(c)
        guard = s.guard_text(st) or f"{d}.get_rank() == 0"
        ind = s.indent(st)
        add(s.edit, st.lineno, st.end_lineno, [f"{ind}if not ({guard}):", f"{ind}    return",
                                               s.lines[st.lineno - 1]], 2, "ORK101", "early-return-before-collective")
    for st, loss, _ in _first(backward):
        guard = s.guard_text(st) or f"{d}.get_rank() == 0"
        ind = s.indent(st)
        add(s.after, st, [f"{ind}if {guard}:", f"{ind}    {d}.all_reduce({loss}.detach())"], 1,
            "ORK101", "reduce-under-guard")

    # ORK102: a write every rank performs
    saves = [c for c in s.calls(_is_save) if _guard_of(c, s.parents) is not None]
    for c in _first(saves):
        g = _guard_of(c, s.parents)
        st = s.statement_of(c)
        header = s.lines[g.lineno - 1]
        if isinstance(g.test, ast.BoolOp) and isinstance(g.test.op, ast.And):
            rest = [v for v in g.test.values if not RANK_TEST.search(ast.unparse(v))]
            if rest and g.test.end_lineno == g.lineno:
                new = f"{s.indent(g)}if {' and '.join(ast.unparse(v) for v in rest)}:\n"
                lines = s.lines[:g.lineno - 1] + [new] + s.lines[g.lineno:]
                lines[c.lineno - 1] = lines[c.lineno - 1].rstrip("\n") + "  # expect: ORK102\n"
                out.append(Mutant("ORK102", "rank-dropped-from-condition", c.lineno, "".join(lines)))
                continue
        if not g.orelse and s.starts_line(g) and g.body[0].lineno > g.lineno:
            shift = g.body[0].col_offset - g.col_offset
            body = [ln[shift:] if ln[:shift].strip() == "" else ln
                    for ln in s.lines[g.body[0].lineno - 1:g.end_lineno]]
            add(s.edit, g.lineno, g.end_lineno, body, c.lineno - g.body[0].lineno, "ORK102", "guard-removed")
    for st, loss, loop in _first(backward):
        ind = s.indent(st)
        add(s.after, st, [f'{ind}torch.save({{"loss": {loss}.detach()}}, "latest_loss.pt")'], 0,
            "ORK102", "save-in-loop")
        add(s.after, st, [f'{ind}with open("metrics.json", "w") as f:', f'{ind}    json.dump({{"loss": float({loss})}}, f)'],
            0, "ORK102", "json-in-loop")
        add(s.after, st, [f'{ind}for name in ("last.pt", "backup.pt"):',
                          f'{ind}    torch.save({{"loss": {loss}.detach()}}, name)'], 1, "ORK102", "loop-variable-path")

    # ORK103: a read on every rank right after rank 0's write
    for c in _first([c for c in saves if len(c.args) >= 2 and isinstance(_guard_of(c, s.parents), ast.If)
                     and s.statement_of(c) in _guard_of(c, s.parents).body]):
        g = _guard_of(c, s.parents)
        path = ast.unparse(c.args[1])
        ind = s.indent(g)
        add(s.after, g, [f'{ind}reloaded = torch.load({path}, map_location="cpu", weights_only=False)'], 0,
            "ORK103", "torch-load-after-guard")
        add(s.after, g, [f'{ind}with open({path}, "rb") as f:', f'{ind}    raw = f.read()'], 0,
            "ORK103", "open-after-guard")

    # ORK104: a logged metric that is this rank's own value
    for st, loss, loop in _first(backward):
        guard = s.guard_text(st)
        ind = s.indent(st)
        step = ast.unparse(loop.target) if isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) else "0"
        forms = {
            "print-fstring": f'print(f"step {{{step}}} loss {{{loss}.item():.4f}}")',
            "logging": f'logging.info("loss %.4f", {loss}.item())',
            "tensorboard": f'writer.add_scalar("train/loss", {loss}.item(), {step})',
            "wandb": f'wandb.log({{"train_loss": {loss}.item()}})',
        }
        for form, line in forms.items():
            if guard:
                add(s.after, st, [f"{ind}if {guard}:", f"{ind}    {line}"], 1, "ORK104", form)
            else:
                add(s.after, st, [f"{ind}{line}"], 0, "ORK104", form)

    # ORK105: a stop decision on this rank's own metric
    for st, loss, loop in _first([b for b in backward if not isinstance(b[2], ast.FunctionDef)]):
        ind = s.indent(st)     # (in a step method the loop is its caller's: no stop to inject there)
        add(s.after, st, [f"{ind}if {loss}.item() < 1e-3:", f"{ind}    break"], 0, "ORK105", "threshold-break")
        add(s.after, st, [f"{ind}if torch.isnan({loss}):", f"{ind}    break"], 0, "ORK105", "nan-break")
        if _func_of(st, s.parents) is not None:
            add(s.after, st, [f"{ind}if not math.isfinite({loss}.item()):", f"{ind}    return"], 0,
                "ORK105", "not-finite-return")

    # ORK106: the DDP wrapper's state_dict saved
    for c in _first(s.calls(lambda n: isinstance(n.func, ast.Attribute) and n.func.attr == "state_dict"
                            and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "module")):
        if c.lineno == c.end_lineno:
            seg = ast.get_source_segment(source, c)
            new = s.lines[c.lineno - 1].replace(seg, ast.unparse(c.func.value.value) + ".state_dict()", 1)
            add(s.edit, c.lineno, c.lineno, [new], 0, "ORK106", "module-dropped")
    for c in _first(s.calls(lambda n: isinstance(n.func, ast.Attribute) and n.func.attr == "state_dict"
                            and isinstance(n.func.value, ast.Call) and isinstance(n.func.value.func, ast.Attribute)
                            and n.func.value.func.attr == "unwrap_model" and n.func.value.args)):
        if c.lineno == c.end_lineno:
            seg = ast.get_source_segment(source, c)
            new = s.lines[c.lineno - 1].replace(seg, ast.unparse(c.func.value.args[0]) + ".state_dict()", 1)
            add(s.edit, c.lineno, c.lineno, [new], 0, "ORK106", "unwrap-dropped")
    wrapped = s.ddp_names()
    for name in _first(wrapped):
        for g in _first([g for g in ifs if _func_of(g, s.parents) is not None]):
            last = g.body[-1]
            ind = s.indent(last)
            add(s.after, last, [f'{ind}torch.save({name}.state_dict(), "model_final.pt")'], 0, "ORK106",
                "wrapper-saved")
            add(s.after, last, [f"{ind}final = dict(model={name}.state_dict(), step=0)",
                                f'{ind}torch.save(final, "final.pt")'], 0, "ORK106", "dict-wrapped")
            add(lambda: s.with_record(s.after(
                last, [f"{ind}final = FinalCheckpoint(model_state={name}.state_dict(), step=0)",
                       f'{ind}torch.save(asdict(final), "final.pt")'], 0, "ORK106", "dataclass-asdict")))

    # ORK107: torch.load without map_location
    for c in _first(s.calls(lambda n: ast.unparse(n.func) == "torch.load"
                            and any(k.arg == "map_location" for k in n.keywords))):
        seg = ast.get_source_segment(source, c)
        bare = ast.Call(c.func, c.args, [k for k in c.keywords if k.arg != "map_location"])
        first = s.lines[c.lineno - 1]
        last = s.lines[c.end_lineno - 1]
        head = first[:c.col_offset]
        tail = last.encode()[c.end_col_offset:].decode() if c.lineno != c.end_lineno else \
            first.encode()[c.end_col_offset:].decode()
        if seg is not None:
            add(s.edit, c.lineno, c.end_lineno, [head + ast.unparse(bare) + tail], 0, "ORK107", "map-location-dropped")
    for st, loss, loop in _first(backward):
        if isinstance(loop, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = [b for b in loop.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            loop = body[0]
        ind = s.indent(loop)
        add(s.before, loop, [f'{ind}if os.path.exists("checkpoint.pt"):',
                             f'{ind}    resumed = torch.load("checkpoint.pt", weights_only=True)'], 1,
            "ORK107", "resume-before-loop")
        add(s.before, loop, [f'{ind}with open("checkpoint.pt", "rb") as fh:',
                             f'{ind}    resumed = torch.load(fh, weights_only=True)'], 1,
            "ORK107", "load-from-handle")
    return out
