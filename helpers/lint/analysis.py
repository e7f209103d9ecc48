"""The analysis behind ORK101-ORK107, on Python's ``ast``: no code is imported or run.

How it reasons. Every function body (and the module's top level) is walked twice: once as
rank 0 would run it and once as any other rank would. A condition on the rank (``rank == 0``,
``dist.get_rank() != 0``, ``accelerator.is_main_process``, ``master_process``, a variable
assigned from these) is decided for each of the two; any other condition is taken to go the
same way on every rank, so both of its branches are walked, in step. The two walks give:

* the sequence of collectives each rank reaches: a collective that one sequence has and the
  other cannot match is reached by only some ranks (ORK101);
* for each write, whether every rank surely performs it (ORK102) or rank 0 alone does, and
  what every rank reads after it (ORK103).

A condition that mentions the rank but cannot be decided (``rank % 2 == 0``, an unknown
``self.is_leader()``) makes everything under it uncertain, and uncertain code is never
reported: findings are precise before they are complete. Calls to functions defined in the
same file are followed one level for guards (``save_on_master``) and transitively for
collectives (a helper that runs ``all_reduce`` is a collective for its callers).
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from helpers.lint import rules
from helpers.lint.rules import Finding

# ---------------------------------------------------------------- vocabulary

DEFAULT_ALIASES = {
    "dist": "torch.distributed", "dcp": "torch.distributed.checkpoint", "torch": "torch",
    "np": "numpy", "numpy": "numpy", "nn": "torch.nn", "F": "torch.nn.functional",
    "DDP": "torch.nn.parallel.DistributedDataParallel",
    "FSDP": "torch.distributed.fsdp.FullyShardedDataParallel",
    "mp": "torch.multiprocessing", "json": "json", "os": "os", "io": "io", "sys": "sys",
    "wandb": "wandb", "tempfile": "tempfile", "shutil": "shutil",
    "Accelerator": "accelerate.Accelerator", "SummaryWriter": "torch.utils.tensorboard.SummaryWriter",
}

COLLECTIVES = {
    "barrier", "monitored_barrier", "all_reduce", "reduce", "broadcast", "all_gather", "gather",
    "scatter", "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
    "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "new_group",
}
DCP_COLLECTIVES = {"save", "load", "async_save", "save_state_dict", "load_state_dict"}
ACCELERATE_COLLECTIVES = {"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "check_trigger"}
REDUCERS = {"all_reduce", "reduce", "all_gather", "all_gather_object", "gather", "gather_object",
            "all_gather_into_tensor", "reduce_scatter", "gather_for_metrics", "check_trigger"}
DIST_SETUP = {"torch.distributed.init_process_group", "torch.nn.parallel.DistributedDataParallel",
              "torch.distributed.fsdp.FullyShardedDataParallel", "torch.distributed.fsdp.fully_shard",
              "torch.distributed._composable.fsdp.fully_shard", "accelerate.Accelerator",
              "torch.distributed.device_mesh.init_device_mesh"}
SPAWNERS = {"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
            "helpers.spawn.run", "accelerate.notebook_launcher"}

RANK_SPAWNERS = {"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"}  # fn(rank, *args)
RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK",
            "PMI_RANK"}
RANK_FUNCS = {"get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank", "get_ordinal",
              "get_world_rank"}
MAIN_FUNCS = {"is_main_process", "is_master", "is_rank_zero", "is_global_zero", "is_local_main_process",
              "is_world_process_zero", "is_local_process_zero", "is_main", "is_primary", "is_rank0",
              "is_master_process", "is_local_master"}
RANK_ATTRS = {"rank", "local_rank", "global_rank", "process_index", "local_process_index", "world_rank",
              "node_rank"}
MAIN_ATTRS = MAIN_FUNCS | {"master_process", "main_process", "is_main_proc"}
RANK_NAMES = RANK_ATTRS
MAIN_NAMES = MAIN_ATTRS | {"rank0", "is_rank_0", "master"}
ALWAYS_TRUE = {"torch.distributed.is_initialized", "torch.distributed.is_available"}
ALWAYS_TRUE_NAMES = {"is_dist_avail_and_initialized", "is_dist_initialized", "is_distributed"}
RANKISH_WORDS = {"rank", "rank0", "master", "main", "zero", "primary", "leader", "chief"}

COURSE_WRITERS = {"helpers.lessons.races.slow_save"}
COURSE_READERS = {"helpers.lessons.races.try_load"}
SINK_METHODS = {"add_scalar", "add_scalars", "log_metric", "log_metrics"}
LOG_METHODS = {"info", "warning", "warn", "debug", "error", "critical", "log"}
METRIC_RE = re.compile(r"loss|acc|correct|ppl|perplex|metric", re.I)
LOSS_CALL_RE = re.compile(r"loss|criterion|cross_entropy|nll|mse|bce|kl_div", re.I)
LOSS_TYPE_RE = re.compile(r"loss|entropy|criterion|divergence", re.I)
DDP_NAME_RE = re.compile(r"^(ddp|ddp_\w+|\w+_ddp)$")
# calls whose result holds their arguments' values unchanged (a state_dict passed in is saved as it is)
RECORD_COPIES = {"dict", "collections.OrderedDict", "OrderedDict", "dataclasses.asdict", "dataclasses.astuple",
                 "vars", "copy.copy", "copy.deepcopy", "dataclasses.replace"}
UNWRAPPED_WORDS = ("without", "no_ddp", "unwrap", "raw", "bare", "inner")

PATH_CALLS = {"os.path.join", "pathlib.Path", "Path", "os.fspath", "str", "os.path.abspath",
              "os.path.expanduser", "pathlib.PurePath", "os.path.realpath"}
PATH_WORDS = {"path", "file", "filename", "fname", "ckpt", "checkpoint", "dir", "folder", "snapshot", "out",
              "output", "dest", "destination", "target", "log", "logdir", "save", "pt", "pth", "json", "csv",
              "txt", "npy", "tmp", "staging"}

PER_PROCESS_TEMP = {"tempfile.mkdtemp", "tempfile.mkstemp", "tempfile.NamedTemporaryFile",
                    "tempfile.TemporaryDirectory", "tempfile.TemporaryFile", "tempfile.mktemp",
                    "os.getpid", "uuid.uuid4", "uuid.uuid1", "secrets.token_hex", "secrets.token_urlsafe"}

MAIN, OTHER = "main", "other"
SAME = "same on every rank"


def _identifier_words(name: str) -> set[str]:
    return {w for w in re.split(r"[_\W]+", name.lower()) if w}


# ---------------------------------------------------------------- program structure

@dataclass
class Scope:
    node: ast.AST                      # ast.Module or a function definition
    parent: "Scope | None"
    cls: ast.ClassDef | None = None    # the class, for a method
    assigns: dict = field(default_factory=dict)   # name -> [value node or None]
    params: set = field(default_factory=set)
    loop_iters: dict = field(default_factory=dict)  # loop variable -> [what it iterates over]

    @property
    def body(self):
        return self.node.body

    @property
    def name(self) -> str:
        return getattr(self.node, "name", "<module>")


def _targets(target, value, out: dict):
    """Record ``name -> value`` for an assignment target (element-wise for tuples)."""
    if isinstance(target, ast.Name):
        out.setdefault(target.id, []).append(value)
    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
            and target.value.id == "self":
        out.setdefault("self." + target.attr, []).append(value)
    elif isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            values = value.elts
        else:       # a, b = f(...): each name comes from the call (for what it is reduced or made from)
            values = [value if isinstance(value, ast.Call) else None] * len(target.elts)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
                value.func.attr == "prepare" and len(value.args) == len(target.elts):
            # model, opt = accelerator.prepare(model, opt): each target is prepare(<its argument>)
            values = [ast.copy_location(ast.Call(func=value.func, args=[a], keywords=[]), value)
                      for a in value.args]
        for t, v in zip(target.elts, values):
            _targets(t, v, out)
    elif isinstance(target, ast.Starred):
        _targets(target.value, None, out)


def own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node of a scope's body, without entering nested functions, classes or lambdas."""
    stack = list(reversed(list(ast.iter_child_nodes(node))))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


_OWN_CACHE_ATTR = "_ork_own"


def _own(node: ast.AST) -> list:
    """:func:`own_nodes` of a scope, computed once (kept on the node, so it lives as long as the tree)."""
    cached = getattr(node, _OWN_CACHE_ATTR, None)
    if cached is None:
        cached = list(own_nodes(node))
        setattr(node, _OWN_CACHE_ATTR, cached)
    return cached


def calls_in(node: ast.AST) -> list[ast.Call]:
    """The calls of one statement or expression in evaluation order (arguments before the call)."""
    out: list[ast.Call] = []

    def visit(n):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        for child in ast.iter_child_nodes(n):
            visit(child)
        if isinstance(n, ast.Call):
            out.append(n)

    visit(node)
    return out


def dotted(expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = dotted(expr.value)
        return f"{base}.{expr.attr}" if base else None
    return None


def text(node) -> str:
    try:
        s = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every node 3.11 parses
        s = "..."
    return s if len(s) <= 60 else s[:57] + "..."


class Program:
    """One file (or the cells of one notebook, in order) and what is known about its names."""

    def __init__(self, module: ast.Module, cells_mode: bool):
        self.module = module
        self.cells_mode = cells_mode
        self.aliases: dict[str, str] = {}
        self.scopes: list[Scope] = []
        self.scope_of: dict[int, Scope] = {}
        self.functions: dict[str, list[Scope]] = {}
        self.class_assigns: dict[int, dict] = {}
        self.value_scope: dict[int, Scope] = {}      # a `self.x = v` value -> the method it is in
        self.classes: dict[str, list[ast.ClassDef]] = {}
        self._collect_imports()
        self._collect_scopes(module, None, None)
        self._kind_cache: dict = {}
        self._kind_busy: set = set()

    # -- structure
    def _collect_imports(self):
        for n in ast.walk(self.module):
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        self.aliases[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
                for a in n.names:
                    self.aliases[a.asname or a.name] = f"{n.module}.{a.name}"

    def _collect_scopes(self, node, parent: Scope | None, cls):
        scope = Scope(node, parent, cls)
        self.scopes.append(scope)
        self.scope_of[id(node)] = scope
        if not isinstance(node, ast.Module):
            args = node.args
            for a in args.posonlyargs + args.args + args.kwonlyargs:
                scope.params.add(a.arg)
            for a in (args.vararg, args.kwarg):
                if a:
                    scope.params.add(a.arg)
            self.functions.setdefault(node.name, []).append(scope)
        for n in _own(node):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    _targets(t, n.value, scope.assigns)
            elif isinstance(n, ast.AnnAssign) and n.value is not None:
                _targets(n.target, n.value, scope.assigns)
            elif isinstance(n, ast.AugAssign):
                _targets(n.target, n, scope.assigns)
            elif isinstance(n, ast.NamedExpr):
                _targets(n.target, n.value, scope.assigns)
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
                _targets(n.target, None, scope.assigns)
                if isinstance(n.target, ast.Name):
                    scope.loop_iters.setdefault(n.target.id, []).append(n.iter)
            elif isinstance(n, ast.withitem) and n.optional_vars is not None:
                _targets(n.optional_vars, n.context_expr, scope.assigns)
        if cls is not None:
            ca = self.class_assigns.setdefault(id(cls), {})
            for k, v in scope.assigns.items():
                if k.startswith("self."):
                    ca.setdefault(k, []).extend(v)
                    for x in v:
                        if x is not None:
                            self.value_scope[id(x)] = scope
        for n in _own(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._collect_scopes(n, scope, None)
            elif isinstance(n, ast.ClassDef):
                self.classes.setdefault(n.name, []).append(n)
                for m in n.body:
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self._collect_scopes(m, scope, n)

    # -- names
    def qualname(self, expr) -> str | None:
        """``dist.barrier`` -> ``torch.distributed.barrier`` through the file's imports."""
        if isinstance(expr, ast.Name):
            if expr.id in self.aliases:
                return self.aliases[expr.id]
            return DEFAULT_ALIASES.get(expr.id, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.qualname(expr.value)
            return f"{base}.{expr.attr}" if base else None
        return None

    def values_of(self, name: str, scope: Scope) -> tuple[list, bool] | None:
        """The values assigned to a name (or ``self.x``) seen from ``scope``; (values, is_param)."""
        if name.startswith("self."):
            s = scope
            while s is not None and s.cls is None:
                s = s.parent
            if s is None:
                return None
            return self.class_assigns.get(id(s.cls), {}).get(name), False
        s = scope
        while s is not None:
            if name in s.params:
                return s.assigns.get(name, []), True
            if name in s.assigns:
                return s.assigns[name], False
            s = s.parent
        return None

    def loop_iterables(self, name: str, scope: Scope) -> list | None:
        s = scope
        while s is not None:
            if name in s.params:
                return None
            if name in s.assigns:
                return s.loop_iters.get(name) if all(v is None for v in s.assigns[name]) else None
            s = s.parent
        return None

    def call_sites(self, fn: Scope) -> list[tuple[ast.Call, Scope, bool]]:
        """Where this file calls ``fn``: (call, calling scope, is a spawn whose first argument is the rank).

        A method is reached through ``self.m(...)`` in its class; ``__init__`` through ``Cls(...)``.
        """
        sites = self.__dict__.setdefault("_sites", None)
        if sites is None:
            sites = self._sites = {}
            for sc in self.scopes:
                for n in _own(sc.node):
                    if not isinstance(n, ast.Call):
                        continue
                    for f in self.resolve_functions(n, sc):
                        sites.setdefault(id(f), []).append((n, sc, False))
                    if isinstance(n.func, ast.Name) and n.func.id in self.classes and n.func.id not in self.aliases:
                        for c in self.classes[n.func.id]:
                            for m in self.functions.get("__init__", []):
                                if m.cls is c:
                                    sites.setdefault(id(m), []).append((n, sc, False))
                    if (self.qualname(n.func) or "") in RANK_SPAWNERS and n.args and isinstance(n.args[0], ast.Name):
                        for f in self.functions.get(n.args[0].id, []):
                            sites.setdefault(id(f), []).append((n, sc, True))
        return sites.get(id(fn), [])

    def param_kind(self, name: str, fn: Scope, depth: int = 0):
        """What a parameter is, from every call of its function in this file (a few calls deep).

        ``mp.spawn(main, ...)`` hands ``main`` the rank as its first argument; ``Trainer(model, rank)``
        hands ``__init__``'s second parameter whatever ``rank`` is at the call.
        """
        node = fn.node
        params = [a.arg for a in node.args.posonlyargs + node.args.args]
        if fn.cls is not None and params[:1] == ["self"]:
            params = params[1:]
        if name not in params or depth > 3:
            return None
        i = params.index(name)
        kinds = []
        for call, caller, spawned in self.call_sites(fn):
            if spawned:
                kinds.append(("rank",) if i == 0 else None)
                continue
            arg = next((k.value for k in call.keywords if k.arg == name), None)
            if arg is None and any(isinstance(a, ast.Starred) for a in call.args[:i + 1]):
                return None
            if arg is None and i < len(call.args):
                arg = call.args[i]
            if arg is None:
                return None
            if isinstance(arg, ast.Name) and caller.node is not self.module:
                found = self.values_of(arg.id, caller)
                if found and found[1]:
                    owner = caller
                    while owner is not None and arg.id not in owner.params:
                        owner = owner.parent
                    kinds.append(self.param_kind(arg.id, owner, depth + 1) if owner else None)
                    continue
            kinds.append(self.kind(arg, caller))
        if kinds and all(k == kinds[0] for k in kinds) and kinds[0] is not None and kinds[0][0] == "rank":
            return kinds[0]
        return None

    def resolve_functions(self, call: ast.Call, scope: Scope) -> list[Scope]:
        """The functions of this file a call may run (by name; ``self.m`` within the class)."""
        f = call.func
        if isinstance(f, ast.Name):
            if f.id in self.aliases:
                return []
            return [s for s in self.functions.get(f.id, []) if s.cls is None]
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
            s = scope
            while s is not None and s.cls is None:
                s = s.parent
            if s is None:
                return []
            return [m for m in self.functions.get(f.attr, []) if m.cls is s.cls]
        if isinstance(f, ast.Attribute) and dotted(f.value):      # obj.m() on an instance of a class of this file
            found = self.values_of(dotted(f.value), scope)
            if found and found[0] and not found[1] and all(
                    isinstance(v, ast.Call) and dotted(v.func) in self.classes for v in found[0]):
                classes = {id(c) for v in found[0] for c in self.classes[dotted(v.func)]}
                return [m for m in self.functions.get(f.attr, []) if m.cls is not None and id(m.cls) in classes]
        return []

    # -- what a value is, as far as the rank goes
    def kind(self, expr, scope: Scope):
        """``("rank",)``, ``("bool", on_rank0, on_others)`` (``None`` = unknown), ``("const", v)``, or None."""
        key = (id(expr), id(scope))
        if key in self._kind_cache:
            return self._kind_cache[key]
        if key in self._kind_busy:
            return None
        self._kind_busy.add(key)
        try:
            k = self._kind(expr, scope)
        finally:
            self._kind_busy.discard(key)
        self._kind_cache[key] = k
        return k

    def _kind(self, e, scope):
        if isinstance(e, ast.Call):
            q = self.qualname(e.func) or ""
            last = q.rsplit(".", 1)[-1] if q else (e.func.attr if isinstance(e.func, ast.Attribute) else "")
            if q in ALWAYS_TRUE or last in ALWAYS_TRUE_NAMES:
                return ("const", True)
            if last in RANK_FUNCS:
                return ("rank",)
            if last in MAIN_FUNCS:
                return ("bool", True, False)
            if q in ("int", "str") and e.args:
                return self.kind(e.args[0], scope)
            if self._env_rank(e):
                return ("rank",)
            for fn in self.resolve_functions(e, scope):
                rets = [n.value for n in _own(fn.node) if isinstance(n, ast.Return) and n.value]
                kinds = {self.kind(r, fn) for r in rets}
                if len(kinds) == 1 and None not in kinds:
                    return kinds.pop()
            return None
        if isinstance(e, ast.Subscript) and self._env_rank(e):
            return ("rank",)
        if isinstance(e, ast.Attribute):
            d = dotted(e)
            if d and d.startswith("self.") and d.count(".") == 1:
                k = self._kind_of_name(d, scope)
                if k is not None:
                    return k
            if e.attr in RANK_ATTRS:
                return ("rank",)
            if e.attr in MAIN_ATTRS:
                return ("bool", True, False)
            return None
        if isinstance(e, ast.Name):
            return self._kind_of_name(e.id, scope)
        if isinstance(e, ast.Constant):
            return ("const", e.value)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            k = self.kind(e.operand, scope)
            return _negate(_as_bool(k))
        if isinstance(e, ast.BoolOp):
            ks = [_as_bool(self.kind(v, scope)) for v in e.values]
            if not any(k and k[0] == "bool" for k in ks):
                return None
            return _combine(ks, isinstance(e.op, ast.And))
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            return self._compare(e, scope)
        if isinstance(e, ast.IfExp):
            a, b = _as_bool(self.kind(e.body, scope)), _as_bool(self.kind(e.orelse, scope))
            t = _as_bool(self.kind(e.test, scope))
            if not any(k and k[0] == "bool" for k in (a, b, t)):
                return None
            out = []
            for i in (1, 2):
                tv = t[i] if t and t[0] == "bool" else (t[1] if t and t[0] == "const" else None)
                av, bv = _side(a, i), _side(b, i)
                out.append(av if tv is True else bv if tv is False else (av if av == bv else None))
            return ("bool", *out)
        return None

    def _kind_of_name(self, name, scope):
        found = self.values_of(name, scope)
        short = name.split(".")[-1]
        if short in MAIN_NAMES:
            return ("bool", True, False)
        if short in RANK_NAMES or (short.endswith("_rank") and "world" not in short):
            return ("rank",)
        if found is None:
            return None
        values, is_param = found
        if is_param and "." not in name:
            owner = scope
            while owner is not None and name not in owner.params:
                owner = owner.parent
            return self.param_kind(name, owner) if owner is not None and owner.node is not self.module else None
        if not values or any(v is None or isinstance(v, ast.AugAssign) for v in values):
            return None
        kinds = [self.kind(v, self.value_scope.get(id(v), scope)) for v in values]
        if all(k == kinds[0] for k in kinds) and kinds[0] is not None and kinds[0][0] != "const":
            return kinds[0]
        if any(k and k[0] in ("rank", "bool") for k in kinds):
            return ("bool", None, None)
        return None

    def _env_rank(self, e) -> bool:
        """``os.environ["RANK"]``, ``os.environ.get("LOCAL_RANK")``, ``os.getenv("RANK", 0)``."""
        if isinstance(e, ast.Subscript) and self.qualname(e.value) == "os.environ":
            s = e.slice
            return isinstance(s, ast.Constant) and s.value in RANK_ENV
        if isinstance(e, ast.Call) and self.qualname(e.func) in ("os.environ.get", "os.getenv") and e.args:
            a = e.args[0]
            return isinstance(a, ast.Constant) and a.value in RANK_ENV
        return False

    def _compare(self, e: ast.Compare, scope):
        left, op, right = e.left, e.ops[0], e.comparators[0]
        lk, rk = self.kind(left, scope), self.kind(right, scope)
        if rk and rk[0] == "rank" and not (lk and lk[0] == "rank"):
            left, right, lk, rk = right, left, rk, lk
            op = {ast.Lt: ast.Gt(), ast.Gt: ast.Lt(), ast.LtE: ast.GtE(), ast.GtE: ast.LtE()}.get(
                type(op), op)
        if lk and lk[0] == "rank":
            if isinstance(right, ast.Constant) and isinstance(right.value, int) \
                    and not isinstance(right.value, bool):
                r0, ro = _rank_vs_const(op, right.value)
                if r0 is not None and r0 == ro:
                    return ("const", r0)           # rank != -1: true on every rank
                return ("bool", r0, ro)
            if isinstance(right, ast.UnaryOp) and isinstance(right.op, ast.USub) and \
                    isinstance(right.operand, ast.Constant) and isinstance(right.operand.value, int):
                r0, ro = _rank_vs_const(op, -right.operand.value)
                return ("const", r0) if r0 is not None and r0 == ro else ("bool", r0, ro)
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)) \
                    and all(isinstance(x, ast.Constant) for x in right.elts):
                vals = [x.value for x in right.elts]
                r0 = 0 in vals
                ro = False if all(v == 0 for v in vals) else None
                if isinstance(op, ast.NotIn):
                    return ("bool", not r0, None if ro is None else True)
                return ("bool", r0, ro)
            return ("bool", None, None)
        lb, rb = _as_bool(lk), _as_bool(rk)
        if lb and lb[0] == "bool" and isinstance(right, ast.Constant) and isinstance(right.value, bool) \
                and isinstance(op, (ast.Eq, ast.Is, ast.NotEq, ast.IsNot)):
            positive = isinstance(op, (ast.Eq, ast.Is)) == right.value
            return lb if positive else _negate(lb)
        if (lb and lb[0] == "bool") or (rb and rb[0] == "bool"):
            return ("bool", None, None)
        return None

    def references_rank(self, expr, scope) -> bool:
        """Does the expression mention the rank anywhere (a per-rank path, a rank label)?"""
        for n in ast.walk(expr):
            if isinstance(n, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                k = self.kind(n, scope)
                if k and k[0] in ("rank", "bool"):
                    return True
        return False

    def rankish(self, expr) -> bool:
        """Does the expression name something rank-like (permissive: used to stay silent)?"""
        for n in ast.walk(expr):
            name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
            if name and _identifier_words(name) & RANKISH_WORDS:
                return True
            if isinstance(n, ast.Constant) and n.value in RANK_ENV:
                return True
        return False

    def condition(self, test, scope, side: str):
        """(depends on the rank, value on this side).

        The value is True/False when the rank decides it, ``SAME`` when the rank parts are decided
        and the rest is data every rank shares (``rank == 0 and step % 10 == 0`` on a rank other
        than 0 is False; on rank 0 it is SAME: every rank 0 takes it at the same steps), and None
        when it depends on the rank in a way this analysis cannot decide.
        """
        v = self._cond(test, scope, side)
        if v is SAME:
            return (self.kind(test, scope) is not None or self.rankish(test)), SAME
        return True, v

    def _cond(self, e, scope, side):
        if isinstance(e, ast.BoolOp):
            vals = [self._cond(v, scope, side) for v in e.values]
            stop = isinstance(e.op, ast.And) is False       # `or` stops at True, `and` at False
            if stop in vals:
                return stop
            if None in vals:
                return None
            if SAME in vals:
                return SAME
            return not stop
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            v = self._cond(e.operand, scope, side)
            return v if v in (None, SAME) else not v
        k = _as_bool(self.kind(e, scope))
        if k and k[0] == "bool":
            return k[1] if side == MAIN else k[2]
        if k and k[0] == "const":
            return bool(k[1])
        if self.rankish(e):
            return None
        return SAME


def _side(k, i):
    if k is None:
        return None
    if k[0] == "const":
        return bool(k[1])
    if k[0] == "bool":
        return k[i]
    return None


def _as_bool(k):
    """A rank used as a truth value is falsy on rank 0 and truthy elsewhere."""
    if k and k[0] == "rank":
        return ("bool", False, True)
    return k


def _negate(k):
    if k is None:
        return None
    if k[0] == "const":
        return ("const", not k[1])
    if k[0] == "bool":
        return ("bool", *(None if v is None else not v for v in k[1:]))
    return None


def _combine(ks, is_and: bool):
    out = []
    for i in (1, 2):
        vals = [_side(k, i) for k in ks]
        if is_and:
            out.append(False if False in vals else (True if all(v is True for v in vals) else None))
        else:
            out.append(True if True in vals else (False if all(v is False for v in vals) else None))
    return ("bool", *out)


def _rank_vs_const(op, c: int):
    """(value on rank 0, value on any other rank) of ``rank <op> c``."""
    if c < 0:      # a rank is never negative: rank == -1 is false everywhere
        return {ast.Eq: (False, False), ast.NotEq: (True, True), ast.Gt: (True, True),
                ast.GtE: (True, True), ast.Lt: (False, False), ast.LtE: (False, False)}.get(type(op), (None, None))
    table = {
        ast.Eq: (c == 0, False if c == 0 else None),
        ast.NotEq: (c != 0, True if c == 0 else None),
        ast.Gt: (0 > c, True if c <= 0 else None),
        ast.GtE: (0 >= c, True if c <= 1 else None),
        ast.Lt: (0 < c, False if c <= 1 else None),
        ast.LtE: (0 <= c, False if c <= 0 else None),
    }
    return table.get(type(op), (None, None))


# ---------------------------------------------------------------- what a call does

@dataclass
class Event:
    kind: str            # "coll", "write", "read", "sync", "call"
    node: ast.Call
    uncertain: bool      # under a rank condition that could not be decided
    detail: object = None


class Facts:
    """Per-call facts that do not depend on the walk: collectives, writes, reads."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.collective_fns: dict[int, str] = {}      # id(scope) -> the collective it runs
        self._find_collective_functions()

    def accelerator(self, expr, scope) -> bool:
        """An accelerate ``Accelerator``: decided by what this file assigns it; by its name only when
        it comes from elsewhere (a parameter) or from a call this file does not explain."""
        d = dotted(expr) or ""
        found = self.prog.values_of(d, scope) if d else None
        if found and found[0]:
            made = [(self.prog.qualname(v.func) or "").rsplit(".", 1)[-1] if isinstance(v, ast.Call) else ""
                    for v in found[0]]
            if all(m == "Accelerator" for m in made):
                return True
            if all(m[:1].isupper() for m in made):
                return False         # an object of another class, whatever its name
        return d.split(".")[-1] in ("accelerator", "accel")

    def collective(self, call: ast.Call, scope) -> str | None:
        q = self.prog.qualname(call.func) or ""
        if q.startswith("torch.distributed.") and q.count(".") == 2 and q.rsplit(".", 1)[1] in COLLECTIVES:
            return "dist." + q.rsplit(".", 1)[1]
        if q.startswith("torch.distributed.checkpoint.") and q.rsplit(".", 1)[1] in DCP_COLLECTIVES:
            return "dcp." + q.rsplit(".", 1)[1]
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr in ACCELERATE_COLLECTIVES and self.accelerator(f.value, scope):
            return f"{dotted(f.value)}.{f.attr}"
        return None

    def _find_collective_functions(self):
        changed = True
        while changed:
            changed = False
            for s in self.prog.scopes:
                if isinstance(s.node, ast.Module) or id(s) in self.collective_fns:
                    continue
                for n in _own(s.node):
                    if isinstance(n, ast.Call):
                        c = self.collective(n, s) or self.inner_collective(n, s)
                        if c:
                            self.collective_fns[id(s)] = c
                            changed = True
                            break

    def inner_collective(self, call, scope) -> str | None:
        for fn in self.prog.resolve_functions(call, scope):
            if id(fn) in self.collective_fns:
                return self.collective_fns[id(fn)]
        return None

    def _handle(self, expr, scope) -> str | None:
        """'memory' for a BytesIO, 'file' for a handle from open()/tempfile, else None."""
        if isinstance(expr, ast.Call):
            q = self.prog.qualname(expr.func) or ""
            if q in ("io.BytesIO", "io.StringIO", "BytesIO", "StringIO"):
                return "memory"
            if q == "open" or q.startswith("tempfile."):
                return "file"
            return None
        if isinstance(expr, ast.Name):
            found = self.prog.values_of(expr.id, scope)
            if found and found[0] and not found[1]:
                kinds = {self._handle(v, scope) if v is not None else None for v in found[0]}
                if len(kinds) == 1:
                    return kinds.pop()
        return None

    def pathlike(self, e, scope, depth=0) -> bool:
        """Is this a file path shared by the ranks (a string, a joined path, a path-named variable)?

        File descriptors, handles returned by unknown calls and other opaque values are not: a
        write to them is not reported.
        """
        if isinstance(e, ast.Constant):
            return isinstance(e.value, (str, bytes))
        if isinstance(e, ast.JoinedStr):
            return True
        if isinstance(e, ast.BinOp):
            return self.pathlike(e.left, scope, depth) or self.pathlike(e.right, scope, depth)
        if isinstance(e, ast.Call):
            q = self.prog.qualname(e.func) or ""
            if q in PATH_CALLS:
                return True
            return isinstance(e.func, ast.Attribute) and e.func.attr in ("joinpath", "with_suffix", "with_name")
        if isinstance(e, ast.Subscript):
            k = e.slice
            return isinstance(k, ast.Constant) and isinstance(k.value, str) and \
                bool(_identifier_words(k.value) & PATH_WORDS)
        if isinstance(e, (ast.Name, ast.Attribute)):
            d = dotted(e) or ""
            found = self.prog.values_of(d, scope) if isinstance(e, ast.Name) or d.startswith("self.") else None
            if isinstance(e, ast.Name) and depth < 3:
                iters = self.prog.loop_iterables(e.id, scope)
                if iters and all(self._iterates_paths(it, scope, depth + 1) for it in iters):
                    return True        # `for name in ("last.pt", "best.pt"): torch.save(obj, name)`
            if found and found[0] and not found[1]:
                return depth < 3 and any(v is not None and not isinstance(v, ast.AugAssign)
                                         and self.pathlike(v, scope, depth + 1) for v in found[0])
            return bool(_identifier_words(d.split(".")[-1]) & PATH_WORDS)
        return False

    def _iterates_paths(self, it, scope, depth) -> bool:
        """Does iterating over ``it`` give paths (a literal list of them, a glob, a path-named list)?"""
        if isinstance(it, (ast.Tuple, ast.List, ast.Set)):
            return bool(it.elts) and all(self.pathlike(x, scope, depth) for x in it.elts)
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and \
                it.func.attr in ("glob", "rglob", "iterdir"):
            return True
        if isinstance(it, ast.Call) and (self.prog.qualname(it.func) or "") in ("glob.glob", "os.listdir"):
            return True
        if isinstance(it, ast.Name):
            found = self.prog.values_of(it.id, scope)
            if found and found[0] and not found[1] and all(v is not None for v in found[0]):
                return all(self._iterates_paths(v, scope, depth + 1) for v in found[0]) if depth < 3 else False
        return False

    def _per_process(self, expr, scope, depth=0) -> bool:
        """A path that differs per rank or per process (mentions the rank, or comes from tempfile)."""
        if self.prog.references_rank(expr, scope):
            return True
        for n in ast.walk(expr):
            if isinstance(n, ast.Call) and (self.prog.qualname(n.func) or "") in PER_PROCESS_TEMP:
                return True
            if isinstance(n, ast.Name) and depth < 2:
                found = self.prog.values_of(n.id, scope)
                if found and found[0] and not found[1] and all(v is not None for v in found[0]) and \
                        all(self._per_process(v, scope, depth + 1) for v in found[0]):
                    return True
        return False

    @staticmethod
    def _arg(call, index, name):
        for k in call.keywords:
            if k.arg == name:
                return k.value
        if len(call.args) > index and not any(isinstance(a, ast.Starred) for a in call.args[:index + 1]):
            return call.args[index]
        return None

    def write(self, call: ast.Call, scope) -> tuple[str, object] | None:
        """(what, path expression or None) when the call writes a file shared by the ranks."""
        q = self.prog.qualname(call.func) or ""
        what = path = None
        if q == "torch.save" or q in COURSE_WRITERS:
            target = self._arg(call, 1, "f")
            if target is None or self._handle(target, scope):
                return None
            what, path = ("torch.save" if q == "torch.save" else q.rsplit(".", 1)[1]), target
        elif q in ("open", "io.open"):
            mode = self._arg(call, 1, "mode")
            if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)
                    and set(mode.value) & set("wax+")):
                return None
            what, path = "open(..., " + repr(mode.value) + ")", self._arg(call, 0, "file")
        elif q in ("numpy.save", "numpy.savez", "numpy.savez_compressed", "numpy.savetxt"):
            what, path = "np." + q.rsplit(".", 1)[1], self._arg(call, 0, "file")
        elif q == "json.dump":
            fp = self._arg(call, 1, "fp")
            if fp is None or isinstance(fp, ast.Call) or self._handle(fp, scope):
                return None        # the open() that made the handle is the write
            return None
        elif q.endswith("SummaryWriter"):
            what, path = "SummaryWriter(...)", self._arg(call, 0, "log_dir")
        elif q == "wandb.init":
            if any(k.arg in ("group",) for k in call.keywords):
                return None        # one wandb run per process, grouped: wandb's own pattern
            what = "wandb.init(...)"
        else:
            return None
        if any(self.prog.references_rank(a, scope) for a in list(call.args) + [k.value for k in call.keywords]):
            return None
        if path is not None and (self._per_process(path, scope) or not self.pathlike(path, scope)):
            return None
        return what, path

    def rename_target(self, call: ast.Call) -> object | None:
        q = self.prog.qualname(call.func) or ""
        if q in ("os.replace", "os.rename", "shutil.move") and len(call.args) >= 2:
            return call.args[1]
        return None

    def read(self, call: ast.Call, scope) -> tuple[str, object] | None:
        q = self.prog.qualname(call.func) or ""
        if q == "torch.load" or q in COURSE_READERS or q == "numpy.load":
            p = self._arg(call, 0, "f")
            if p is None or self._handle(p, scope) == "memory":
                return None
            return ("torch.load" if q == "torch.load" else q.rsplit(".", 1)[1]) + "(...)", p
        if q in ("open", "io.open"):
            mode = self._arg(call, 1, "mode")
            if mode is None or (isinstance(mode, ast.Constant) and isinstance(mode.value, str)
                                and not set(mode.value) & set("wax+")):
                return "open(...)", self._arg(call, 0, "file")
        return None

    def sync(self, call, scope) -> bool:
        if self.collective(call, scope) or self.inner_collective(call, scope):
            return True
        name = call.func.attr if isinstance(call.func, ast.Attribute) else \
            call.func.id if isinstance(call.func, ast.Name) else ""
        return "barrier" in name.lower() or name in ("wait_for_everyone",)


# ---------------------------------------------------------------- the two walks

class Walk:
    """One scope run as rank 0 (``MAIN``) or as any other rank (``OTHER``)."""

    def __init__(self, prog: Program, facts: Facts, scope: Scope, side: str):
        self.prog, self.facts, self.scope, self.side = prog, facts, scope, side
        self.tokens: list[tuple[str, ast.AST | None]] = []
        self.events: list[Event] = []
        self.reached: dict[int, bool] = {}   # id(call) -> uncertain?
        self.exits: list[tuple[str, tuple]] = []   # rank-dependent return/break/continue taken
        self.walk(scope.body, False)

    def record(self, node, uncertain):
        skipped, undecided = self._conditional_calls(node)
        for call in calls_in(node):
            if id(call) in skipped:
                continue
            self.reached[id(call)] = uncertain or id(call) in undecided
            c = self.facts.collective(call, self.scope)
            inner = None if c else self.facts.inner_collective(call, self.scope)
            if c or inner:
                self.tokens.append(("C:" + (c or "fn:" + text(call.func)), call))
            self.events.append(Event("call", call, uncertain or id(call) in undecided))

    def _conditional_calls(self, node) -> tuple[set[int], set[int]]:
        """Calls inside a conditional expression on the rank (``SummaryWriter(d) if rank == 0 else
        None``): those of the branch this side does not take, and those of a branch it may take."""
        skipped: set[int] = set()
        undecided: set[int] = set()
        for e in ast.walk(node):
            if not isinstance(e, ast.IfExp):
                continue
            dep, value = self.prog.condition(e.test, self.scope, self.side)
            if not dep or value is SAME:
                continue
            if value is None:
                undecided |= {id(c) for c in calls_in(e.body) + calls_in(e.orelse)}
            else:
                skipped |= {id(c) for c in calls_in(e.orelse if value else e.body)}
        return skipped, undecided

    def mark(self, s):
        self.tokens.append((s, None))

    def walk(self, stmts, uncertain) -> str | None:
        for st in stmts:
            ex = self.stmt(st, uncertain)
            if ex:
                return ex
        return None

    def stmt(self, st, uncertain) -> str | None:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for d in st.decorator_list:
                self.record(d, uncertain)
            return None
        if isinstance(st, ast.If):
            self.record(st.test, uncertain)
            dep, value = self.prog.condition(st.test, self.scope, self.side)
            key = f"if{id(st)}"
            if value is SAME:
                dep = False
            if dep and value is not None:
                ex = self.walk(st.body if value else st.orelse, uncertain)
                if ex and not uncertain:
                    self.exits.append((ex, _pos(st)))
                return ex if not uncertain else None
            self.mark("(" + key)
            self.walk(st.body, uncertain or dep)
            self.mark("|" + key)
            self.walk(st.orelse, uncertain or dep)
            self.mark(")" + key)
            return None
        if isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            self.record(st.iter if not isinstance(st, ast.While) else st.test, uncertain)
            key = f"loop{id(st)}"
            self.mark("(" + key)
            self.walk(st.body, uncertain)
            self.mark(")" + key)
            self.walk(st.orelse, uncertain)
            return None
        if isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                self.record(item.context_expr, uncertain)
            return self.walk(st.body, uncertain)
        if isinstance(st, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            ex = self.walk(st.body, uncertain)
            for h in st.handlers:
                key = f"exc{id(h)}"
                self.mark("(" + key)
                self.walk(h.body, uncertain)
                self.mark(")" + key)
            if not ex:
                self.walk(st.orelse, uncertain)
            self.walk(st.finalbody, uncertain)
            return ex
        if isinstance(st, ast.Match):
            self.record(st.subject, uncertain)
            for case in st.cases:
                key = f"case{id(case)}"
                self.mark("(" + key)
                self.walk(case.body, uncertain)
                self.mark(")" + key)
            return None
        if isinstance(st, ast.Return):
            if st.value is not None:
                self.record(st.value, uncertain)
            return "return"
        if isinstance(st, ast.Break):
            return "break"
        if isinstance(st, ast.Continue):
            return "continue"
        self.record(st, uncertain)
        return None


# ---------------------------------------------------------------- the rules

class Analysis:
    def __init__(self, module: ast.Module, cells_mode: bool = False):
        self.prog = Program(module, cells_mode)
        self.facts = Facts(self.prog)
        self.walks = {id(s): (Walk(self.prog, self.facts, s, MAIN), Walk(self.prog, self.facts, s, OTHER))
                      for s in self.prog.scopes}
        self.call_scope: dict[int, Scope] = {}
        for s in self.prog.scopes:
            for n in _own(s.node):
                if isinstance(n, ast.Call):
                    self.call_scope[id(n)] = s
        self.distributed = self._distributed_scopes()
        self.guarded = self._guarded_functions()
        self.findings: list[Finding] = []

    # -- which code runs in the ranks
    def _uses_dist(self, scope: Scope) -> bool:
        for n in _own(scope.node):
            if isinstance(n, ast.Call):
                q = self.prog.qualname(n.func) or ""
                if q.startswith("torch.distributed.") or q in DIST_SETUP or self.facts.collective(n, scope):
                    return True
            k = self.prog.kind(n, scope) if isinstance(n, (ast.Call, ast.Subscript, ast.Name)) else None
            if k and k[0] == "rank":
                return True
        return False

    def _setup_calls(self, scope) -> bool:
        return any(isinstance(n, ast.Call) and (self.prog.qualname(n.func) or "") in DIST_SETUP
                   for n in _own(scope.node))

    def _distributed_scopes(self) -> set[int]:
        prog = self.prog
        whole_file = not prog.cells_mode and _is_script(prog.module) and any(
            isinstance(n, ast.Call) and (prog.qualname(n.func) or "") in DIST_SETUP
            for n in ast.walk(prog.module))
        if whole_file:
            return {id(s) for s in prog.scopes}
        seeds = set()
        for s in prog.scopes:
            if isinstance(s.node, ast.Module):
                if self._setup_calls(s):
                    seeds.add(id(s))
            elif self._uses_dist(s):
                seeds.add(id(s))
            for n in _own(s.node):
                if isinstance(n, ast.Call) and (prog.qualname(n.func) or "") in SPAWNERS and n.args:
                    if isinstance(n.args[0], ast.Name):
                        seeds.update(id(f) for f in prog.functions.get(n.args[0].id, []))
        for s in prog.scopes:               # a class that builds DDP in one method: all its methods
            if s.cls is not None and id(s) in seeds:
                seeds.update(id(m) for m in prog.scopes if m.cls is s.cls)
        out = set(seeds)
        frontier = list(seeds)
        by_id = {id(s): s for s in prog.scopes}
        while frontier:
            s = by_id[frontier.pop()]
            callees = []
            for n in _own(s.node):
                if isinstance(n, ast.Call):
                    callees += prog.resolve_functions(n, s)
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    callees.append(prog.scope_of[id(n)])
            for c in callees:
                if id(c) not in out:
                    out.add(id(c))
                    frontier.append(id(c))
        return out

    # -- functions only ever called under a rank-0 guard
    def _guarded_functions(self) -> set[int]:
        prog = self.prog
        sites: dict[int, list[tuple[ast.AST, Scope]]] = {}
        for s in prog.scopes:
            for n in _own(s.node):
                if isinstance(n, ast.Call):
                    for f in prog.resolve_functions(n, s):
                        sites.setdefault(id(f), []).append((n, s))
                    for a in list(n.args) + [k.value for k in n.keywords]:   # passed as a callback
                        if isinstance(a, ast.Name):
                            for f in prog.functions.get(a.id, []):
                                sites.setdefault(id(f), []).append((None, s))
        guarded: set[int] = set()
        changed = True
        while changed:
            changed = False
            for s in prog.scopes:
                if id(s) in guarded or isinstance(s.node, ast.Module) or not sites.get(id(s)):
                    continue
                if all(call is not None and self._other_skips(call, caller, guarded)
                       for call, caller in sites[id(s)]):
                    guarded.add(id(s))
                    changed = True
        return guarded

    def _other_skips(self, call, scope, guarded) -> bool:
        """Does a rank other than 0 surely not run this call (or may not: an undecided guard)?"""
        if id(scope) in guarded:
            return True
        other = self.walks[id(scope)][1]
        state = other.reached.get(id(call))
        return state is None or state is True or self._decorated_rank0(scope)

    def _decorated_rank0(self, scope) -> bool:
        node = scope.node
        for d in getattr(node, "decorator_list", []):
            name = dotted(d.func if isinstance(d, ast.Call) else d) or ""
            if _identifier_words(name.split(".")[-1]) & {"rank", "zero", "main", "master"}:
                return True
        return False

    def other_surely_runs(self, call, scope) -> bool:
        if id(scope) in self.guarded or self._decorated_rank0(scope):
            return False
        state = self.walks[id(scope)][1].reached.get(id(call))
        return state is False

    def rank0_only(self, call, scope) -> bool:
        m, o = self.walks[id(scope)]
        return m.reached.get(id(call)) is False and id(call) not in o.reached

    # -- ORK101
    def ork101(self):
        for s in self.prog.scopes:
            m, o = self.walks[id(s)]
            # A call both walks reach is the same event on every rank: it can only match itself.
            # A call only one walk reaches may match another one-sided call of the same collective
            # (``if rank != 0: barrier()`` ... ``if rank == 0: barrier()``).
            a = [t + (f"#{id(n)}" if n is not None and id(n) in o.reached else "") for t, n in m.tokens]
            b = [t + (f"#{id(n)}" if n is not None and id(n) in m.reached else "") for t, n in o.tokens]
            sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
            matched_a, matched_b = set(), set()
            for block in sm.get_matching_blocks():
                matched_a.update(range(block.a, block.a + block.size))
                matched_b.update(range(block.b, block.b + block.size))
            seen = set()
            for walk, matched, counterpart in ((m, matched_a, o), (o, matched_b, m)):
                for i, (tok, node) in enumerate(walk.tokens):
                    if i in matched or node is None or not tok.startswith("C:") or id(node) in seen:
                        continue
                    if walk.reached.get(id(node)) is not False:
                        continue      # under an undecided condition: stay silent
                    if counterpart.reached.get(id(node)) is False:
                        continue      # both reach this very call: a mismatch elsewhere, not here
                    seen.add(id(node))
                    c = self.facts.collective(node, s)
                    inner = None if c else self.facts.inner_collective(node, s)
                    name = c or text(node.func)
                    exit_ = next(((kind, pos) for kind, pos in counterpart.exits if pos < _pos(node)), None)
                    after = exit_[0] if exit_ else None
                    only_rank0 = walk is m and id(node) not in o.reached and not after
                    # the line of the if that exits, or of the if that holds the call
                    guard = exit_[1][1] if exit_ else self._rank_guard_line(node, s)
                    self.add(node, "ORK101", rules.ork101(name + "()", only_rank0, after, inner, guard))

    def _rank_guard_line(self, node, s) -> int | None:
        """The line of the innermost `if` on the rank, in this function, that holds ``node``."""
        best = None
        for n in own_nodes(s.node):
            if isinstance(n, ast.If) and _pos(n) < _pos(node) and _end(node) <= _end(n) and \
                    self.prog.condition(n.test, s, MAIN)[0] and \
                    any(x is node for b in n.body + n.orelse for x in ast.walk(b)):
                if best is None or _pos(n) > _pos(best):
                    best = n
        return best.lineno if best is not None else None

    # -- ORK102 / ORK103
    def ork102_103(self):
        for s in self.prog.scopes:
            if id(s) not in self.distributed:
                continue
            m, o = self.walks[id(s)]
            writes = []      # rank-0-only writes: (line, key, call)
            for ev in m.events:
                call = ev.node
                w = self.facts.write(call, s)
                if w and self.other_surely_runs(call, s):
                    self.add(call, "ORK102", rules.ork102(w[0]))
                target = self.facts.rename_target(call)
                path = w[1] if w else target
                if path is not None and self.rank0_only(call, s) and not ev.uncertain:
                    writes.append((call, ast.dump(path)))
            if not writes:
                continue
            syncs = [ev.node for ev in m.events + o.events if self.facts.sync(ev.node, s)]
            for ev in o.events:
                r = self.facts.read(ev.node, s)
                if not r or ev.uncertain or not self.other_surely_runs(ev.node, s):
                    continue
                key = ast.dump(r[1]) if r[1] is not None else None
                for wcall, wkey in writes:
                    if wkey != key or _pos(ev.node) <= _end(wcall):
                        continue
                    if any(_end(wcall) < _pos(x) < _pos(ev.node) for x in syncs):
                        continue
                    self.add(ev.node, "ORK103", rules.ork103(r[0], wcall.lineno))
                    break

    # -- ORK104 / ORK105: local metrics
    def _reduced_names(self, s: Scope) -> set[str]:
        names: set[str] = set()
        for n in _own(s.node):
            if isinstance(n, ast.Call) and self._is_reducer(n, s):
                for a in self._reduced_args(n, s):
                    names |= {x.id for x in ast.walk(a) if isinstance(x, ast.Name)}
        changed = True
        while changed:
            changed = False
            for name, values in s.assigns.items():
                if name in names:
                    continue
                for v in values:
                    if v is None:
                        continue
                    if any((isinstance(x, ast.Name) and x.id in names) or
                           (isinstance(x, ast.Call) and self._is_reducer(x, s)) for x in ast.walk(v)):
                        names.add(name)
                        changed = True
                        break
        return names

    def _reduced_args(self, call, s) -> list:
        """The arguments a reducing call changes in place (its result is reduced in any case).

        ``dist.all_reduce(t)`` reduces ``t``; ``dist.all_gather(out, t)`` fills ``out``;
        ``accelerator.gather(x)`` returns the gathered value and leaves ``x`` alone; a function of
        this file reduces the parameters it hands to an in-place collective; an unknown
        ``reduce_*``/``*_gather``/``sync*`` function is taken to reduce all its arguments.
        """
        args = list(call.args) + [k.value for k in call.keywords]
        c = self.facts.collective(call, s)
        if c and c.startswith("dist."):
            return args[:1]
        if c:
            return []
        fns = self.prog.resolve_functions(call, s)
        if fns:
            out = []
            for f in fns:
                params = [a.arg for a in f.node.args.posonlyargs + f.node.args.args]
                if f.cls is not None and params[:1] == ["self"]:
                    params = params[1:]
                inplace = self._inplace_params(f)
                out += [a for p, a in zip(params, call.args) if p in inplace]
                out += [k.value for k in call.keywords if k.arg in inplace]
            return out
        return args

    def _inplace_params(self, f: Scope) -> set[str]:
        out = set()
        for n in _own(f.node):
            if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Name) \
                    and n.args[0].id in f.params:
                c = self.facts.collective(n, f)
                if c and c.startswith("dist."):
                    out.add(n.args[0].id)
        return out

    def _is_reducer(self, call, s) -> bool:
        """The call combines the ranks' values: decided by what it is where this file shows it."""
        q = self.prog.qualname(call.func) or ""
        if q.startswith("torch.") and not q.startswith("torch.distributed"):
            return False          # torch.gather, Tensor ops: this rank's own tensors, not a collective
        c = self.facts.collective(call, s)
        if c:
            return c.rsplit(".", 1)[-1] in REDUCERS
        fns = self.prog.resolve_functions(call, s)
        if fns:                   # a function of this file: it reduces if it runs a collective
            return any(id(f) in self.facts.collective_fns for f in fns)
        if isinstance(call.func, ast.Attribute) and call.func.attr in ("gather", "scatter") and \
                (len(call.args) >= 2 or any(k.arg in ("dim", "index") for k in call.keywords)):
            return False          # x.gather(dim, index): Tensor.gather's signature, a tensor op
        name = call.func.attr if isinstance(call.func, ast.Attribute) else \
            call.func.id if isinstance(call.func, ast.Name) else ""
        return bool(re.search(r"reduce|gather|sync|allreduce", name, re.I))   # code this file cannot see

    def _loss_module(self, callee, s) -> bool | None:
        """What the called object is, where this file assigns it: True for a loss module
        (``criterion = nn.CrossEntropyLoss()``), False for any other object it builds, None if unknown."""
        d = dotted(callee)
        found = self.prog.values_of(d, s) if d else None
        if not found or not found[0] or found[1] or any(v is None for v in found[0]):
            return None
        kinds = set()
        for v in found[0]:
            q = (self.prog.qualname(v.func) or "") if isinstance(v, ast.Call) else ""
            last = q.rsplit(".", 1)[-1]
            if not last[:1].isupper():
                kinds.add(None)             # made by a function call: not known here
            elif LOSS_TYPE_RE.search(last):
                kinds.add(True)             # an instance of a loss class: nn.CrossEntropyLoss, JsdCrossEntropy
            elif q.startswith("torch.") or last in self.prog.classes:
                kinds.add(False)            # a model, a DDP wrapper, a class of this file that is no loss
            else:
                kinds.add(None)
        return kinds.pop() if len(kinds) == 1 else None

    def _local_metrics(self, s: Scope) -> set[str]:
        """Names in this scope that hold this rank's own loss/accuracy (never reduced)."""
        cache = self.__dict__.setdefault("_locals_cache", {})
        if id(s) not in cache:
            cache[id(s)] = set()          # a recursive function sees no locals of its own yet
            cache[id(s)] = self._compute_local_metrics(s)
        return cache[id(s)]

    def _compute_local_metrics(self, s: Scope) -> set[str]:
        reduced = self._reduced_names(s)
        backward = set()
        for n in _own(s.node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward" \
                    and not n.args:                                   # loss.backward(), not accelerator.backward(loss)
                inner = n.func.value
                if isinstance(inner, ast.Call) and inner.args:        # scaler.scale(loss).backward()
                    inner = inner.args[0]
                if isinstance(inner, ast.Name):
                    backward.add(inner.id)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward" \
                    and n.args and isinstance(n.args[0], ast.Name):   # accelerator.backward(loss)
                backward.add(n.args[0].id)
        local = {b for b in backward if b not in reduced}
        changed = True
        while changed:
            changed = False
            for name, values in s.assigns.items():
                if name in local or name in reduced or "." in name or not values:
                    continue
                moving = [v for v in values if not _neutral(v)]      # `total = 0.0` starts a sum
                if moving and all(v is not None and self._local_value(v, local, s) for v in moving):
                    local.add(name)
                    changed = True
        return local

    def _local_value(self, v, local, s) -> bool:
        """An expression computed from this rank's batch: a loss call, a local metric, a match count."""
        if isinstance(v, ast.AugAssign):
            return self._local_value(v.value, local, s)
        for x in ast.walk(v):
            if isinstance(x, ast.Name) and x.id in local:
                return True
            if isinstance(x, ast.Call):
                if self._is_reducer(x, s):
                    return False
                q = self.prog.qualname(x.func) or dotted(x.func) or ""
                last = x.func.attr if isinstance(x.func, ast.Attribute) else q.rsplit(".", 1)[-1]
                if q.startswith("torch.nn.") and last[:1].isupper():
                    continue      # nn.CrossEntropyLoss(): builds a loss module, not a loss value
                if self.prog.resolve_functions(x, s):
                    if self._returns_local(x, s):     # a function of this file: what it returns decides
                        return True
                    continue
                module = self._loss_module(x.func, s)
                if module is not None:                # an object this file builds: what it is decides
                    if module:
                        return True
                    continue
                if LOSS_CALL_RE.search(last):         # code this file cannot see: its name is all there is
                    return True
                if last in ("sum", "mean") and any(isinstance(y, ast.Compare) for y in ast.walk(x.func)):
                    return True
        return False

    def _returns_local(self, call, s) -> bool:
        for f in self.prog.resolve_functions(call, s):
            local = self._local_metrics(f)
            rets = [n.value for n in _own(f.node) if isinstance(n, ast.Return) and n.value is not None]
            if rets and all(any(isinstance(x, ast.Name) and x.id in local for x in ast.walk(r)) and
                            not isinstance(r, ast.Tuple) for r in rets):
                return True
        return False

    def _metric_in(self, expr, local) -> str | None:
        for x in ast.walk(expr):
            if isinstance(x, ast.Name) and x.id in local:
                return x.id
        return None

    def _sink(self, call, s) -> bool:
        q = self.prog.qualname(call.func) or ""
        if isinstance(call.func, ast.Attribute) and call.func.attr == "debug":
            return False     # a DEBUG record is a per-rank diagnostic (each rank's own file), not a report
        if q == "print" or q.startswith("logging.") or q in ("wandb.log", "mlflow.log_metric",
                                                             "mlflow.log_metrics"):
            return True
        f = call.func
        if isinstance(f, ast.Attribute):
            if f.attr in SINK_METHODS:
                return True
            base = (dotted(f.value) or "").split(".")[-1].lower()
            if f.attr in LOG_METHODS and "log" in base:
                return True
            if f.attr in ("log", "print") and self.facts.accelerator(f.value, s):
                return True
        return False

    def ork104(self):
        for s in self.prog.scopes:
            if id(s) not in self.distributed:
                continue
            local = self._local_metrics(s)
            if not local:
                continue
            for n in _own(s.node):
                if not (isinstance(n, ast.Call) and self._sink(n, s)):
                    continue
                args = list(n.args) + [k.value for k in n.keywords]
                name = None
                for a in args:
                    name = name or self._metric_in(a, local)
                if name and not any(self.prog.references_rank(a, s) for a in args):
                    self.add(n, "ORK104", rules.ork104(name, self._set_at(name, n, s)))

    def _set_at(self, name, use, s) -> int | None:
        """The line of the last assignment of ``name`` in ``s`` before ``use`` (the value it reasons from)."""
        lines = [v.lineno for v in s.assigns.get(name, []) if v is not None and hasattr(v, "lineno")
                 and v.lineno <= use.lineno]
        return max(lines) if lines else None

    def ork105(self):
        has_ddp = any(isinstance(n, ast.Call) and (self.prog.qualname(n.func) or "") in DIST_SETUP
                      for n in ast.walk(self.prog.module))
        for s in self.prog.scopes:
            if id(s) not in self.distributed:
                continue
            local = self._local_metrics(s) | self._returned_locals(s)
            if not local:
                continue
            for loop in _own(s.node):
                if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
                    continue
                if not self._loop_syncs(loop, s, has_ddp):
                    continue
                if isinstance(loop, ast.While):
                    name = self._metric_in(loop.test, local)
                    if name:
                        self.add(loop, "ORK105", rules.ork105(name, self._set_at(name, loop, s)))
                for st in _loop_ifs(loop):
                    name = self._metric_in(st.test, local)
                    if name and _stops(st.body, loop):
                        self.add(st, "ORK105", rules.ork105(name, self._set_at(name, st, s)))

    def _returned_locals(self, s):
        out = set()
        for name, values in s.assigns.items():
            if values and all(isinstance(v, ast.Call) and self._returns_local(v, s) for v in values):
                out.add(name)
        return out

    def _loop_syncs(self, loop, s, has_ddp) -> bool:
        """Does the loop run a collective, or DDP's backward (here or in a function of this file it calls)?"""
        for n in ast.walk(loop):
            if isinstance(n, ast.Call):
                if self.facts.collective(n, s) or self.facts.inner_collective(n, s):
                    return True
                if has_ddp and _backward(n):
                    return True
                if has_ddp and any(_backward(x) for f in self.prog.resolve_functions(n, s)
                                   for x in _own(f.node) if isinstance(x, ast.Call)):
                    return True
        return False

    # -- ORK106
    def _wrapped(self, expr, s) -> bool:
        d = dotted(expr)
        if d is None:
            return False
        found = self.prog.values_of(d, s)
        if found and found[0] and not found[1] and all(v is not None for v in found[0]):
            values = sorted(found[0], key=_pos)
            before = [v for v in values if _pos(v) < _pos(expr)]
            wraps = self._wraps((before or values)[-1], s, d)      # the latest assignment decides
            if wraps is not None:
                return wraps
        short = d.split(".")[-1].lower()
        return bool(DDP_NAME_RE.match(short)) and not any(w in short for w in UNWRAPPED_WORDS)

    def _wrapped_at(self, expr, s) -> int | None:
        """The line where ``expr`` was wrapped in DDP (or prepared by accelerate), if this file shows it."""
        found = self.prog.values_of(dotted(expr) or "", s)
        if found and found[0]:
            lines = [v.lineno for v in found[0] if v is not None and self._wraps(v, s, None)]
            return max(lines) if lines else None
        return None

    def _wraps(self, v, s, target) -> bool | None:
        if v is None:
            return None
        if isinstance(v, ast.Call):
            q = self.prog.qualname(v.func) or ""
            if q.endswith("DistributedDataParallel"):
                return True
            if isinstance(v.func, ast.Attribute) and v.func.attr == "prepare" and \
                    self.facts.accelerator(v.func.value, s) and len(v.args) == 1:
                return "model" in (dotted(v.args[0]) or "").lower()
            if isinstance(v.func, ast.Attribute) and v.func.attr in ("unwrap_model", "to", "cuda", "cpu"):
                return False
            return None          # made by a call this file does not explain: the name decides
        return False

    def _saved_objects(self, call, s):
        """The object(s) a save call writes: torch.save/accelerator.save, or a save wrapper of this file."""
        q = self.prog.qualname(call.func) or ""
        is_save = q == "torch.save" or q in COURSE_WRITERS or (
            isinstance(call.func, ast.Attribute) and call.func.attr == "save"
            and self.facts.accelerator(call.func.value, s))
        if not is_save:
            for f in self.prog.resolve_functions(call, s):
                for n in _own(f.node):
                    if isinstance(n, ast.Call) and (self.prog.qualname(n.func) or "") == "torch.save" and \
                            n.args and isinstance(n.args[0], ast.Starred):
                        is_save = True
        if not is_save:
            return []
        obj = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "obj"), None)
        return [obj] if obj is not None and not isinstance(obj, ast.Starred) else []

    def _record_class(self, call) -> bool:
        """``call`` builds an instance of a dataclass or NamedTuple of this file: its fields are its arguments."""
        name = dotted(call.func)
        for c in self.prog.classes.get(name or "", []):
            for d in c.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                if (self.prog.qualname(d) or "") in ("dataclasses.dataclass", "dataclass"):
                    return True
            if any((self.prog.qualname(b) or "").split(".")[-1] == "NamedTuple" for b in c.bases):
                return True
        return False

    def _state_dicts(self, obj, s, depth=0):
        """``X.state_dict()`` calls that end up in the saved object unchanged.

        Seen through: dict displays and ``{**d}``, ``dict(...)``/``OrderedDict(...)``, a dataclass or
        NamedTuple of this file built from them, ``dataclasses.asdict``/``vars``/``copy``/``._asdict()``
        of such a record, and names assigned any of these (three assignments deep)."""
        if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Attribute) and obj.func.attr == "state_dict":
            yield obj
        elif isinstance(obj, ast.Dict):
            for v in obj.values:
                yield from self._state_dicts(v, s, depth)
        elif isinstance(obj, ast.Call) and ((self.prog.qualname(obj.func) or "") in RECORD_COPIES
                                            or self._record_class(obj)):
            for a in list(obj.args) + [k.value for k in obj.keywords]:
                yield from self._state_dicts(a.value if isinstance(a, ast.Starred) else a, s, depth)
        elif isinstance(obj, ast.Call) and isinstance(obj.func, ast.Attribute) and obj.func.attr == "_asdict":
            yield from self._state_dicts(obj.func.value, s, depth)          # record._asdict() of a NamedTuple
        elif isinstance(obj, ast.Name) and depth < 3:
            found = s.assigns.get(obj.id, [])
            for v in found:
                if v is not None:
                    yield from self._state_dicts(v, s, depth + 1)
            for n in _own(s.node):            # snapshot["MODEL"] = ddp.state_dict()
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == obj.id:
                            yield from self._state_dicts(n.value, s, depth + 1)

    def ork106(self):
        for s in self.prog.scopes:
            for n in _own(s.node):
                if not isinstance(n, ast.Call):
                    continue
                for obj in self._saved_objects(n, s):
                    for sd in self._state_dicts(obj, s):
                        if self._wrapped(sd.func.value, s):
                            self.add(sd, "ORK106", rules.ork106(text(sd.func.value),
                                                                self._wrapped_at(sd.func.value, s)))

    # -- ORK107
    def ork107(self):
        for s in self.prog.scopes:
            if id(s) not in self.distributed:
                continue
            for n in _own(s.node):
                if isinstance(n, ast.Call) and (self.prog.qualname(n.func) or "") == "torch.load":
                    if len(n.args) >= 2 or any(k.arg in ("map_location", None) for k in n.keywords):
                        continue
                    target = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg == "f"), None)
                    if target is not None and self.facts._handle(target, s) == "memory":
                        continue
                    self.add(n, "ORK107", rules.ork107())

    # -- running
    def add(self, node, code, message):
        self.findings.append(Finding(node.lineno, node.col_offset + 1, code, message,
                                     getattr(node, "_ork_cell", None)))

    def run(self) -> list[Finding]:
        for rule in (self.ork101, self.ork102_103, self.ork104, self.ork105, self.ork106, self.ork107):
            rule()
        unique = {(f.cell or 0, f.line, f.col, f.code): f for f in self.findings}
        return sorted(unique.values(), key=lambda f: (f.cell or 0, f.line, f.col, f.code))


def _backward(call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "backward"


def _neutral(v) -> bool:
    """A starting value: a number, None, an empty list/dict/tuple."""
    if isinstance(v, ast.Constant):
        return True
    return isinstance(v, (ast.List, ast.Tuple, ast.Dict, ast.Set)) and not getattr(v, "elts", getattr(v, "keys", []))


def _is_script(module: ast.Module) -> bool:
    """A file that runs something when executed (a training script), not a module of definitions.

    In a script that sets up a process group every line runs on every rank; in a library only
    the functions that use ``torch.distributed`` (and what they call) are known to.
    """
    for st in module.body:
        if isinstance(st, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue
        if isinstance(st, (ast.Assign, ast.AnnAssign)) and not any(
                isinstance(n, ast.Call) and dotted(n.func) not in (None,) and
                dotted(n.func).split(".")[-1] in ("DistributedDataParallel", "DDP", "init_process_group",
                                                  "Accelerator", "FSDP", "fully_shard")
                for n in ast.walk(st)):
            continue
        if isinstance(st, ast.Try) and all(isinstance(x, (ast.Import, ast.ImportFrom)) for x in st.body):
            continue
        if isinstance(st, ast.If) and "TYPE_CHECKING" in ast.unparse(st.test):
            continue
        return True
    return False


def _pos(node) -> tuple:
    return (getattr(node, "_ork_cell", 0) or 0, node.lineno, node.col_offset)


def _end(node) -> tuple:
    return (getattr(node, "_ork_cell", 0) or 0, node.end_lineno, node.end_col_offset)


def _loop_ifs(loop) -> Iterable[ast.If]:
    """The ifs inside a loop's body, not inside nested functions."""
    for n in own_nodes(loop):
        if isinstance(n, ast.If):
            yield n


def _stops(body, loop) -> bool:
    """Does this block leave the loop (break, return, sys.exit/exit/quit)?"""
    for n in own_nodes(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Return):
            return True
        if isinstance(n, ast.Break) and _break_target(n, body, loop):
            return True
        if isinstance(n, ast.Call) and dotted(n.func) in ("sys.exit", "exit", "quit", "os._exit"):
            return True
    return False


def _break_target(brk, body, loop) -> bool:
    """A break that leaves ``loop`` (not a loop nested inside the if)."""
    for st in body:
        for n in ast.walk(st):
            if isinstance(n, (ast.For, ast.While, ast.AsyncFor)) and any(x is brk for x in ast.walk(n)):
                return False
    return True


def analyse(module: ast.Module, cells_mode: bool = False) -> list[Finding]:
    return Analysis(module, cells_mode).run()
