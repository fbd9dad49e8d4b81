"""A property-based fuzz of the public API (hypothesis), at 2 and 3 ranks.

Each example is one call: its arguments are drawn from the strategies below, the same on every
rank (hypothesis derandomized, or seeded by ``--fuzz-seed``, and no rank's draw depends on its
rank; the values in arrays do). Each drawn argument is either one torch takes or one it refuses.
The property, judged the same way on every rank from every rank's outcome:

- all arguments taken: every rank returns, with the numpy reference's result;
- some argument refused: every rank raises an allowed type whose message names an argument of
  the call (the rank that refused: ``TypeError``, ``ValueError``, ``RuntimeError``; at ``DETAIL`` the
  others may raise ``DistError`` naming it);
- afterwards a plain all_reduce on the group and on the world is still right.

The call runs first on a group made at ``DETAIL``, then again on a group made at ``OFF`` (the
default level) with the same outcome. Where only some ranks refused, the others learn it at
``OFF`` too, from the refusing rank's notice (docs/hangs.md, "One rank refuses"): they raise
``DistBackendError`` naming it, or return where their part finished before the notice came (a
small gather's sender); either way the group is unusable afterwards on every rank, so such an
example runs at ``OFF`` on a group of its own. Verdicts that fail an example: "hang" (a rank's
wait ran past the deadline), "asymmetric" (a rank returned while another refused, unexplained by
the above), "wrong", "other". Collectives run with ``async_op=True`` and each Work is waited for
with a deadline; blocking calls run in groups whose timeout is that deadline, so a hang ends
the job through the watchdog, whose report and dumps name the operation and group.

CI runs a fixed budget (``--fuzz-examples``, 60 per plan, derandomized: the same examples every
run: 5 s at 2 ranks and 23 s at 3 on an idle 2-core VM, where 3 ranks are oversubscribed); a longer
run: ``--fuzz-examples 2000 --fuzz-seed N``. docs/bad_input.md's section "What the fuzz refuses"
lists, per function, each refused argument the fuzz drew alone and what every rank raised; it is
written by a run at 2 ranks with ``--fuzz-classes docs/bad_input.md``, between its markers.
"""
import operator
import shutil
import tempfile
from datetime import timedelta
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest

import hpc_c10d as dist
from hpc_c10d.work import WaitTimedOut
from support.reference import assert_in_sync, make_op, op_valid, reduce_inputs, reduce_ref

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis (the test extra) is not installed")
st = hypothesis.strategies

DEADLINE = timedelta(seconds=20)  # per call: a Work's wait, and the fuzz groups' timeout
ALLOWED = (TypeError, ValueError, RuntimeError)  # what a rank that refuses its arguments may raise
REFUSED_ELSEWHERE = "was refused by the arguments of"  # the DistError of a rank that did not (DETAIL)
NOTICED = "refused its arguments"  # the DistBackendError of a rank that did not (OFF: the refusal's notice)
DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "complex64"]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]


class Arg(NamedTuple):
    """One drawn argument: how the docs name it, whether torch takes it, and how a rank builds it."""

    label: str
    valid: bool
    make: Callable[..., Any]  # make() -> the value; for an array, make(base) -> base in this form


class Call(NamedTuple):
    """One drawn call: its function, its arguments and how a rank runs it on a group."""

    function: str
    args: dict  # parameter name -> Arg
    run: Callable[[int, int, Any], list]  # run(rank, size, group) -> [(actual, expected)], checked when valid
    fresh_group: bool = False  # point-to-point: a group of its own, so that no refused example's message
    #                            posted before the refusal can match a later example's receive

    @property
    def valid(self) -> bool:
        return all(arg.valid for arg in self.args.values())

    def __repr__(self) -> str:
        return f"{self.function}({', '.join(f'{k}={a.label}' for k, a in self.args.items())})"


# ------------------------------------------------------------------------------ argument pools
def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _strided(a):
    wide = np.zeros(2 * a.size, a.dtype)
    wide[::2] = a.ravel()
    return wide[::2]


ARRAYS = {  # label -> (valid as an output, valid as an input, make(base))
    "a contiguous array": (True, True, lambda a: a),
    "an (n, 1) array": (True, True, lambda a: a.reshape(-1, 1)),
    "a read-only array": (False, True, _readonly),
    "a strided view": (False, True, _strided),
    "a Python list": (False, False, lambda a: a.tolist()),
    "None": (False, False, lambda a: None),
    "an object array": (False, False, lambda a: a.astype(object)),
}
VALID_ARRAYS = ["a contiguous array", "an (n, 1) array"]
try:  # torch tensors through the same API, where torch is installed
    import torch

    ARRAYS["a torch tensor"] = (True, True, lambda a: torch.from_numpy(a))
    ARRAYS["a strided torch tensor"] = (False, True, lambda a: torch.from_numpy(_strided(a)))
    VALID_ARRAYS.append("a torch tensor")
except ImportError:
    torch = None


def arrays(output: bool, elements: int = 2):
    """An array argument: mostly contiguous, sometimes one of the refused kinds (a strided view of
    fewer than 2 ``elements`` is contiguous, so an output may be one)."""
    def pick(label):
        ok_out, ok_in, make = ARRAYS[label]
        ok_out = ok_out or ("strided" in label and elements < 2)
        return Arg(label, ok_out if output else ok_in, lambda base: make(base))
    return st.one_of(st.sampled_from(VALID_ARRAYS), st.sampled_from(sorted(ARRAYS))).map(pick)


def ranks(size: int):
    """A rank argument: a member as int or numpy integer (taken), or one torch refuses."""
    good = st.integers(0, size - 1).flatmap(lambda r: st.sampled_from([
        Arg(f"{r}", True, lambda: r), Arg(f"np.int64({r})", True, lambda: np.int64(r)),
        Arg(f"np.uint8({r})", True, lambda: np.uint8(r))]))
    bad = st.sampled_from([Arg("-1", False, lambda: -1), Arg("the group size", False, lambda: size),
                           Arg('"0"', False, lambda: "0"), Arg("1.0", False, lambda: 1.0)])
    return st.one_of(good, good, bad)


def reduce_ops():
    valid = st.sampled_from(OPS).map(lambda name: Arg(name, True, lambda: make_op(name)))
    bad = st.sampled_from([Arg('"sum"', False, lambda: "sum"), Arg("0", False, lambda: 0),
                           Arg("None", False, lambda: None)])
    return st.one_of(valid, valid, bad)


def _tag_ub() -> int:
    from mpi4py import MPI

    return dist.group.WORLD.comm.Get_attr(MPI.TAG_UB)


def tags():
    ub = _tag_ub()
    good = st.sampled_from([Arg("0", True, lambda: 0), Arg("7", True, lambda: 7), Arg("TAG_UB", True, lambda: ub)])
    bad = st.sampled_from([Arg("-1", False, lambda: -1), Arg("TAG_UB + 1", False, lambda: ub + 1),
                           Arg("2**40", False, lambda: 2**40), Arg("1.5", False, lambda: 1.5),
                           Arg('"1"', False, lambda: "1")])
    return st.one_of(good, bad)


def lengths():
    """How far a list's length is from one per rank (0: taken)."""
    return st.sampled_from([0, 0, 0, -1, 1]).map(lambda d: Arg(f"size {d:+d}" if d else "one per rank", d == 0,
                                                                lambda: d))


# ------------------------------------------------------------------------------ the calls
def _waited(result):
    """Wait for a Work (with the deadline); pass anything else through."""
    if isinstance(result, dist.Work):
        result.wait(timeout=DEADLINE)
    return result


def _values(r, n, dtype):
    """Rank ``r``'s data: small integers, exact in every dtype here."""
    return ((np.arange(n) % 3) + r + 1).astype(dtype)


@st.composite
def all_reduce_like(draw, size, function):
    """all_reduce / reduce: an array, an op, and reduce's root."""
    dtype, n, op = draw(st.sampled_from(DTYPES)), draw(st.integers(0, 5)), draw(reduce_ops())
    tensor = draw(arrays(output=True, elements=n))
    args = {"tensor": tensor, "op": op}
    op_ok = op.valid and op_valid(dtype, op.label)
    if function == "reduce":
        args["dst"] = draw(ranks(size))
    args["dtype"] = Arg(dtype, op_ok or not op.valid, lambda: dtype)  # an op this dtype lacks: refused

    def run(rank, size, group):
        inputs = reduce_inputs((n,), dtype, op.label if op.valid else "SUM", size)
        x = tensor.make(inputs[rank].copy())
        if function == "reduce":
            dst = args["dst"].make()
            _waited(dist.reduce(x, dst=dst, op=op.make(), group=group, async_op=True))
            if rank != operator.index(dst):
                return [(x, inputs[rank].reshape(np.shape(x)))]
        else:
            _waited(dist.all_reduce(x, op=op.make(), group=group, async_op=True))
        return [(x, reduce_ref(inputs, op.label).reshape(np.shape(x)))]
    return Call(function, args, run)


@st.composite
def broadcasts(draw, size):
    dtype, n = draw(st.sampled_from(DTYPES)), draw(st.integers(0, 5))
    args = {"tensor": draw(arrays(output=True, elements=n)), "src": draw(ranks(size))}

    def run(rank, size, group):
        src = args["src"].make()
        x = args["tensor"].make(_values(rank, n, dtype))
        _waited(dist.broadcast(x, src=src, group=group, async_op=True))
        return [(x, _values(operator.index(src), n, dtype).reshape(np.shape(x)))]
    return Call("broadcast", args, run)


@st.composite
def all_gathers(draw, size):
    """all_gather into a list, or gather to a root (the list on the root only)."""
    dtype, n = draw(st.sampled_from(DTYPES)), draw(st.integers(0, 4))
    grow = draw(st.sampled_from([0, 0, 0, 1]))
    args = {"tensor": draw(arrays(output=False)), "list": draw(arrays(output=True, elements=n + grow)),
            "length": draw(lengths()),
            "block size": Arg("equal" if grow == 0 else "one element more", grow == 0, lambda: grow)}
    rooted = draw(st.booleans())
    if rooted:
        args["dst"] = draw(ranks(size))

    def run(rank, size, group):
        mine = args["tensor"].make(_values(rank, n, dtype))
        count, grow = size + args["length"].make(), args["block size"].make()
        blocks = [args["list"].make(np.zeros(n + grow, dtype)) for _ in range(count)]
        if not rooted:
            _waited(dist.all_gather(blocks, mine, group=group, async_op=True))
        else:
            dst = args["dst"].make()
            is_root = rank == dst if isinstance(dst, (int, np.integer)) else False
            _waited(dist.gather(mine, blocks if is_root else None, dst=dst, group=group, async_op=True))
            if not is_root:
                return []
        return [(b, _values(i, n, dtype).reshape(np.shape(b))) for i, b in enumerate(blocks)]
    return Call("gather" if rooted else "all_gather", args, run)


@st.composite
def scatters(draw, size):
    dtype, n = draw(st.sampled_from(DTYPES)), draw(st.integers(0, 4))
    args = {"tensor": draw(arrays(output=True, elements=n)), "scatter_list": draw(arrays(output=False)),
            "length": draw(lengths()), "src": draw(ranks(size))}

    def run(rank, size, group):
        src = args["src"].make()
        is_root = rank == src if isinstance(src, (int, np.integer)) else False
        out = args["tensor"].make(np.zeros(n, dtype))
        blocks = [args["scatter_list"].make(_values(i + 1, n, dtype)) for i in range(size + args["length"].make())]
        _waited(dist.scatter(out, blocks if is_root else None, src=src, group=group, async_op=True))
        return [(out, _values(rank + 1, n, dtype).reshape(np.shape(out)))]
    return Call("scatter", args, run)


@st.composite
def into_tensors(draw, size):
    """all_gather_into_tensor / reduce_scatter_tensor: the output's size against the input's."""
    function = draw(st.sampled_from(["all_gather_into_tensor", "reduce_scatter_tensor"]))
    dtype, n = draw(st.sampled_from(DTYPES)), draw(st.integers(1, 4))
    grow = draw(st.sampled_from([0, 0, 0, 1, -1]))
    elements = (n * size if function == "all_gather_into_tensor" else n) + grow
    args = {"output": draw(arrays(output=True, elements=elements)), "input": draw(arrays(output=False)),
            "output size": Arg("as required" if grow == 0 else f"{grow:+d} element", grow == 0, lambda: grow),
            "output dtype": draw(st.sampled_from(["same", "same", "same", "int8"]).map(
                lambda t: Arg(t, t == "same", lambda: t)))}

    def run(rank, size, group):
        odt = dtype if args["output dtype"].make() == "same" else args["output dtype"].make()
        grow = args["output size"].make()
        if function == "all_gather_into_tensor":
            out = args["output"].make(np.zeros(max(n * size + grow, 0), odt))
            _waited(dist.all_gather_into_tensor(out, args["input"].make(_values(rank, n, dtype)), group=group,
                                                async_op=True))
            expected = np.concatenate([_values(r, n, dtype) for r in range(size)])
        else:
            inputs = [np.concatenate([_values(q + i, n, dtype) for i in range(size)]) for q in range(size)]
            out = args["output"].make(np.zeros(max(n + grow, 0), odt))
            _waited(dist.reduce_scatter_tensor(out, args["input"].make(inputs[rank]), group=group, async_op=True))
            expected = reduce_ref([_values(q + rank, n, dtype) for q in range(size)], "SUM")
        return [(out, expected.reshape(np.shape(out)))]
    return Call(function, args, run)


@st.composite
def reduce_scatters(draw, size):
    dtype, n = draw(st.sampled_from(DTYPES)), draw(st.integers(0, 4))
    args = {"output": draw(arrays(output=True, elements=n)), "input_list": draw(arrays(output=False)),
            "length": draw(lengths()), "op": draw(reduce_ops())}
    args["dtype"] = Arg(dtype, not args["op"].valid or op_valid(dtype, args["op"].label), lambda: dtype)

    def run(rank, size, group):
        op = args["op"].label if args["op"].valid else "SUM"
        inputs = reduce_inputs((n,), dtype, op, size)  # rank q sends inputs[(q + i) % size] to rank i
        out = args["output"].make(np.zeros(n, dtype))
        count = size + args["length"].make()
        blocks = [args["input_list"].make(inputs[(rank + i) % size].copy()) for i in range(count)]
        _waited(dist.reduce_scatter(out, blocks, op=args["op"].make(), group=group, async_op=True))
        expected = reduce_ref([inputs[(q + rank) % size] for q in range(size)], op)
        return [(out, expected.reshape(np.shape(out)))]
    return Call("reduce_scatter", args, run)


@st.composite
def all_to_alls(draw, size, single, odd_blocks=False):
    """all_to_all_single; all_to_all between lists the same on every rank, and with ``odd_blocks``
    (the arrays all taken) one block possibly a size off, which is then a different block on each
    rank: some ranks refuse, some do not."""
    dtype, n = draw(st.sampled_from(DTYPES)), draw(st.integers(2, 4))
    taken = Arg("a contiguous array", True, lambda base: base)
    args = {"output": taken if odd_blocks else draw(arrays(output=True)),
            "input": taken if odd_blocks else draw(arrays(output=False))}
    if single:
        args["splits"] = draw(st.sampled_from(["even", "even", "explicit", "too many", "wrong sum"]).map(
            lambda s: Arg(s, s in ("even", "explicit"), lambda: s)))
    elif odd_blocks:
        args["odd block"] = draw(st.sampled_from(["none", "output", "input"]).flatmap(
            lambda where: st.integers(0, size - 1).map(
                lambda i: Arg("none" if where == "none" else f"{where} block {i} one element more",
                              where == "none", lambda: (where, i)))))
    else:
        args["odd block"] = Arg("none", True, lambda: ("none", 0))

    def block(src, dst):
        return _values(3 * src + dst, n, dtype)

    def run(rank, size, group):
        if single:
            how = args["splits"].make()
            splits = {"even": None, "explicit": [n] * size, "too many": [n] * (size + 1),
                      "wrong sum": [n + 1] * size}[how]
            out = args["output"].make(np.zeros(n * size, dtype))
            inp = args["input"].make(np.concatenate([block(rank, d) for d in range(size)]))
            _waited(dist.all_to_all_single(out, inp, splits, splits, group=group, async_op=True))
            return [(out, np.concatenate([block(s, rank) for s in range(size)]).reshape(np.shape(out)))]
        where, odd = args["odd block"].make()
        outs = [args["output"].make(np.zeros(n + (where == "output" and i == odd), dtype)) for i in range(size)]
        ins = [args["input"].make(np.resize(block(rank, d), n + (where == "input" and d == odd)))
               for d in range(size)]
        _waited(dist.all_to_all(outs, ins, group=group, async_op=True))
        return [(o, block(s, rank).reshape(np.shape(o))) for s, o in enumerate(outs)]
    return Call("all_to_all_single" if single else "all_to_all", args, run)


@st.composite
def point_to_points(draw, size, vary_tags):
    """A ring: every rank sends to the next and receives from the previous (isend/irecv, or a batch);
    either the tensors and peers vary, or the tags."""
    dtype, n = draw(st.sampled_from(DTYPES)), draw(st.integers(0, 4))
    valid = Arg("a contiguous array", True, lambda base: base)
    args = {"tensor": valid if vary_tags else draw(arrays(output=False)),
            "recv tensor": valid if vary_tags else draw(arrays(output=True, elements=n)),
            "tag": draw(tags()) if vary_tags else draw(st.sampled_from(
                [Arg("0", True, lambda: 0), Arg("np.int64(3)", True, lambda: np.int64(3))])),
            "peer": Arg("neighbour", True, lambda: "neighbour") if vary_tags else draw(
                st.sampled_from(["neighbour", "neighbour", "np.int64 neighbour", "-1", "the group size"]).map(
                    lambda p: Arg(p, "neighbour" in p, lambda: p)))}
    batched = draw(st.booleans())

    def run(rank, size, group):
        how = args["peer"].make()

        def peer(r):
            return {"-1": -1, "the group size": size}.get(how, (np.int64 if "np" in how else int)(r % size))
        got = args["recv tensor"].make(np.zeros(n, dtype))
        sent = args["tensor"].make(_values(rank, n, dtype))
        tag = args["tag"].make()
        if batched:
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, peer(rank + 1), group, tag),
                                            dist.P2POp(dist.irecv, got, peer(rank - 1), group, tag)])
        else:
            works = [dist.isend(sent, peer(rank + 1), group, tag), dist.irecv(got, peer(rank - 1), group, tag)]
        for work in works:
            _waited(work)
        return [(got, _values((rank - 1) % size, n, dtype).reshape(np.shape(got)))]
    return Call("P2POp/batch_isend_irecv" if batched else "isend/irecv", args, run, fresh_group=True)


@st.composite
def object_collectives(draw, size):
    function = draw(st.sampled_from(["broadcast_object_list", "all_gather_object"]))
    args = {"object_list": draw(st.sampled_from(["a list", "a list", "a list", "a tuple", "None"]).map(
        lambda k: Arg(k, k == "a list", lambda: k))), "length": draw(lengths())}
    length = args["length"].make()
    # all_gather_object needs a slot per rank (more are left alone); broadcast_object_list any length
    args["length"] = Arg(args["length"].label, length >= 0 or function == "broadcast_object_list", lambda: length)
    if function == "broadcast_object_list":
        args["src"] = draw(ranks(size))

    def run(rank, size, group):
        kind, count = args["object_list"].make(), size + args["length"].make()
        wrap = {"a list": list, "a tuple": tuple, "None": lambda x: None}[kind]
        if function == "all_gather_object":
            objects = wrap([None] * count)
            dist.all_gather_object(objects, {"rank": rank}, group=group)
            return [(objects, [{"rank": r} for r in range(size)] + [None] * (count - size))]
        src = args["src"].make()
        objects = wrap([("from", rank, i) for i in range(count)])
        dist.broadcast_object_list(objects, src=src, group=group)
        return [(objects, [("from", operator.index(src), i) for i in range(count)])]
    return Call(function, args, run)


@st.composite
def new_groups(draw, size):
    members = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size, unique=True))
    args = {"ranks": draw(st.sampled_from(["ints", "ints", "np.int64s", "a duplicate", "the world size", "a str"]).map(
        lambda k: Arg(k, k in ("ints", "np.int64s"), lambda: k))),
            "timeout": draw(st.sampled_from(["None", "30 s", "0", "-1 s", "5 (an int)"]).map(
                lambda k: Arg(k, k in ("None", "30 s"), lambda: k)))}

    def run(rank, size, group):
        kind = args["ranks"].make()
        chosen = {"ints": members, "np.int64s": [np.int64(r) for r in members], "a duplicate": members + members[:1],
                  "the world size": members + [size], "a str": "".join(map(str, members))}[kind]
        timeout = {"None": None, "30 s": timedelta(seconds=30), "0": timedelta(0), "-1 s": timedelta(seconds=-1),
                   "5 (an int)": 5}[args["timeout"].make()]
        made = dist.new_group(chosen, timeout=timeout)
        try:
            if rank not in members:
                return [(made, dist.GroupMember.NON_GROUP_MEMBER)]
            x = np.ones(2)
            dist.all_reduce(x, group=made)
            return [(x, np.full(2, float(len(members))))]
        finally:
            if rank in members:
                dist.destroy_process_group(made)
    return Call("new_group", args, run)


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@st.composite
def store_calls(draw, size):
    start = draw(st.integers(-1000, 1000))
    amount = draw(st.one_of(
        st.integers(INT64_MIN, INT64_MAX).map(lambda a: Arg("an int64", True, lambda: a)),
        st.sampled_from([Arg("np.int64(5)", True, lambda: np.int64(5)), Arg("2**63", False, lambda: 1 << 63),
                         Arg("2**70", False, lambda: 1 << 70), Arg("-2**63-1", False, lambda: INT64_MIN - 1),
                         Arg("1.5", False, lambda: 1.5), Arg('"1"', False, lambda: "1")])))
    key = draw(st.sampled_from([Arg('"k"', True, lambda: "k"), Arg("5", False, lambda: 5),
                                Arg("None", False, lambda: None)]))

    def run(rank, size, group):
        store = dist.HashStore()
        store.set("k", str(start))
        total = store.add(key.make(), amount.make())
        want = (start + operator.index(amount.make()) - INT64_MIN) % (1 << 64) + INT64_MIN
        return [(total, want), (store.get("k"), str(want).encode())]
    return Call("Store.add", {"key": key, "amount": amount}, run)


@st.composite
def store_entries(draw, size):
    """set then get, or wait for keys: keys, values and key lists torch's store takes or refuses (a bytes
    key, which torch's binding takes, is refused here: docs/differences.md)."""
    key = draw(st.sampled_from([Arg('"k"', True, lambda: "k"), Arg('""', True, lambda: ""), Arg("5", False, lambda: 5),
                                Arg("None", False, lambda: None), Arg('b"k"', False, lambda: b"k")]))
    value = draw(st.sampled_from([Arg('"v"', True, lambda: "v"), Arg('b"\\xff"', True, lambda: b"\xff"),
                                  Arg("5", False, lambda: 5), Arg("None", False, lambda: None)]))
    keys = draw(st.sampled_from([Arg('["k"]', True, lambda: ["k"]), Arg('"k"', False, lambda: "k"),
                                 Arg("[5]", False, lambda: [5]), Arg("None", False, lambda: None)]))
    waiting = draw(st.booleans())

    def run(rank, size, group):
        store = dist.HashStore()
        if waiting:
            store.set("k", "v")
            store.wait(keys.make(), timedelta(seconds=5))
            return []
        store.set(key.make(), value.make())
        made = value.make()
        return [(store.get(key.make()), made.encode() if isinstance(made, str) else bytes(made))]
    if waiting:
        return Call("Store.wait", {"keys": keys}, run)
    return Call("Store.set", {"key": key, "value": value}, run)


@st.composite
def subgroups(draw, size):
    """new_subgroups (collective over the world) or monitored_barrier on the group."""
    timeout = draw(st.sampled_from([Arg("None", True, lambda: None), Arg("30 s", True, lambda: timedelta(seconds=30)),
                                    Arg("0", False, lambda: timedelta(0)),
                                    Arg("-1 s", False, lambda: timedelta(seconds=-1)),
                                    Arg("5 (an int)", False, lambda: 5)]))
    if draw(st.booleans()):
        def barrier(rank, size, group):
            dist.monitored_barrier(group, timeout=timeout.make())
            return []
        return Call("monitored_barrier", {"timeout": timeout}, barrier)
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    group_size = draw(st.one_of(
        st.sampled_from(divisors).map(lambda d: Arg(f"{d}", True, lambda: d)),
        st.sampled_from([Arg("0", False, lambda: 0), Arg("the world size + 1", False, lambda: size + 1),
                         Arg('"1"', False, lambda: "1")] + [Arg(f"{d} (no divisor)", False, lambda d=d: d)
                                                            for d in range(2, size) if size % d])))

    def split(rank, size, group):
        mine, every = dist.new_subgroups(group_size.make(), timeout=timeout.make())
        try:
            x = np.ones(2)
            dist.all_reduce(x, group=mine)
            return [(x, np.full(2, float(group_size.make())))]
        finally:
            for made in every:
                if isinstance(made, dist.ProcessGroup):
                    dist.destroy_process_group(made)
    return Call("new_subgroups", {"group_size": group_size, "timeout": timeout}, split)


@st.composite
def checkpoints(draw, size):
    """checkpoint.save of a state dict (a Shard per rank, a replicated array, a scalar) and load into
    targets of a drawn shape; needs h5py, and a directory every rank sees (``SHARED``)."""
    n, dtype = draw(st.integers(1, 4)), draw(st.sampled_from(DTYPES))
    kinds = ["a dict", "a dict", "a dict", "a list", "a key with '/'", "an empty key", "a set as a value",
             "Shard axis 1 of a 1-d array"]
    args = {"state_dict": draw(st.sampled_from(kinds).map(lambda k: Arg(k, k == "a dict", lambda: k))),
            "load target": draw(st.sampled_from(["the saved shape", "the saved shape", "one row more",
                                                 "another dtype"]).map(lambda k: Arg(k, k == "the saved shape",
                                                                                     lambda: k)))}

    def run(rank, size, group):
        from hpc_c10d import checkpoint

        path = f"{SHARED['dir']}/state.h5"
        mine = _values(rank, n, dtype)
        state = {"w": checkpoint.Shard(mine, 0), "b": _values(0, 2, dtype), "step": 7}
        kind = args["state_dict"].make()
        state = {"a list": [state], "a key with '/'": {"a/b": mine}, "an empty key": {"": mine},
                 "a set as a value": {"s": {1, 2}}, "Shard axis 1 of a 1-d array": {"w": checkpoint.Shard(mine, 1)},
                 "a dict": state}[kind]
        checkpoint.save(state, path, group=group)
        target = args["load target"].make()
        rows = n + (target == "one row more")
        into = {"w": checkpoint.Shard(np.zeros(rows, "int8" if target == "another dtype" else dtype), 0),
                "b": np.zeros(2, dtype), "step": 0}
        checkpoint.load(into, path, group=group)
        return [(into["w"].array, mine), (into["b"], _values(0, 2, dtype)), (into["step"], 7)]
    return Call("checkpoint.save/checkpoint.load/checkpoint.Shard", args, run)


SHARED: dict = {}  # "dir": a directory of rank 0's that every rank writes in (made by the test)


PLANS = {  # name -> (size -> the strategy of its calls)
    "all_reduce": lambda size: all_reduce_like(size, "all_reduce"),
    "reduce": lambda size: all_reduce_like(size, "reduce"),
    "broadcast": broadcasts,
    "all_gather, gather": all_gathers,
    "scatter": scatters,
    "all_gather_into_tensor, reduce_scatter_tensor": into_tensors,
    "reduce_scatter": reduce_scatters,
    "all_to_all": lambda size: all_to_alls(size, False),
    "all_to_all: blocks": lambda size: all_to_alls(size, False, odd_blocks=True),
    "all_to_all_single": lambda size: all_to_alls(size, True),
    "isend, irecv, batch_isend_irecv": lambda size: point_to_points(size, False),
    "isend, irecv, batch_isend_irecv: tags": lambda size: point_to_points(size, True),
    "broadcast_object_list, all_gather_object": object_collectives,
    "new_group": new_groups,
    "Store.add": store_calls,
    "Store.set, Store.get, Store.wait": store_entries,
    "new_subgroups, monitored_barrier": subgroups,
    "checkpoint": checkpoints,
}


# ------------------------------------------------------------------------------ the property
class Outcome(NamedTuple):
    """What one rank saw: "ok", "wrong" (returned a wrong result), "refused" (an allowed error of its
    own), "elsewhere" (DETAIL's DistError or OFF's notice naming another rank's refusal), "hang" (a
    wait past the deadline) or "other"; whether the error names an argument; the detail; whether the
    group computed right afterwards."""

    kind: str
    names_argument: bool
    detail: str
    after: str  # "" when the group's all_reduce afterwards was right


def _parameters(call: Call) -> set:
    """The words an error message may name the call's arguments by (``state_dict`` also as prose)."""
    import importlib
    import inspect

    owners = {"": dist, "Store": dist.HashStore, "checkpoint": importlib.import_module("hpc_c10d.checkpoint")}
    words = {call.function.lower()}
    for name in call.function.replace("/", " ").split():
        owner, _, attribute = name.rpartition(".")
        function = getattr(owners[owner], attribute, None)
        if function is not None:
            parameters = set(inspect.signature(function).parameters)
            words |= parameters | {p.replace("_", " ") for p in parameters} | {attribute.lower()}
    return words - {"self", "group", "async_op"}


def _same(actual, expected) -> str:
    if torch is not None and isinstance(actual, torch.Tensor):
        actual = actual.numpy()
    try:
        if isinstance(expected, np.ndarray):
            assert isinstance(actual, np.ndarray), f"got {type(actual).__name__}"
            np.testing.assert_array_equal(actual, expected, strict=True)
        else:
            assert actual == expected, f"{actual!r} != {expected!r}"
    except AssertionError as exc:
        return str(exc)
    return ""


def _outcome(call: Call, rank: int, size: int, group: Any) -> Outcome:
    try:
        pairs = call.run(rank, size, group)
    except Exception as exc:  # noqa: B902 - every outcome is judged below, on every rank alike
        text = f"{type(exc).__name__}: {exc}"
        names = any(word in str(exc).lower() for word in _parameters(call))
        if isinstance(exc, WaitTimedOut):
            kind = "hang"
        elif isinstance(exc, dist.DistError):
            kind = "elsewhere" if REFUSED_ELSEWHERE in str(exc) or NOTICED in str(exc) else "other"
        else:
            kind = "refused" if isinstance(exc, ALLOWED) else "other"
        return Outcome(kind, names, text, _after(rank, size, group))
    wrong = "; ".join(problem for problem in (_same(a, e) for a, e in pairs) if problem)
    return Outcome("wrong" if wrong else "ok", True, wrong, _after(rank, size, group))


def _after(rank: int, size: int, group: Any) -> str:
    """A plain all_reduce on the group: "" when right."""
    try:
        x = np.full(2, rank + 1, np.int64)
        _waited(dist.all_reduce(x, group=group, async_op=True))
        return _same(x, np.full(2, size * (size + 1) // 2, np.int64))
    except Exception as exc:  # noqa: B902
        return f"{type(exc).__name__}: {exc}"


def _judge(call: Call, level: str, outcomes: list, mixed: bool = False) -> None:
    """Raise AssertionError (on every rank, from the same outcomes) unless the property holds;
    ``mixed``: the call some ranks refused and others did not, at OFF (the group is unusable after)."""
    report = "\n".join(f"  rank {r}: {o.kind}: {o.detail[:400]}{'; afterwards ' + o.after if o.after else ''}"
                       for r, o in enumerate(outcomes))
    where = f"{call!r} at {level}:\n{report}"
    kinds = {o.kind for o in outcomes}
    assert "hang" not in kinds, f"hang: a rank waited past the deadline in {where}"
    if mixed:
        assert all("unusable" in o.after for o in outcomes), f"the group is not unusable on every rank after {where}"
    else:
        assert not any(o.after for o in outcomes), f"the group is broken after {where}"
    if call.valid:
        assert kinds == {"ok"}, f"torch takes these arguments, but not every rank returned the reference: {where}"
        return
    returned = {"ok"} if mixed else set()  # a part that finished before the notice came (then unusable)
    assert kinds <= {"refused", "elsewhere"} | returned, f"asymmetric: a rank returned while another refused {where}"
    assert "refused" in kinds, f"refused arguments, but no rank raised an allowed error: {where}"
    assert all(o.names_argument for o in outcomes if o.kind != "ok"), f"an error that names no argument: {where}"


def _mixed(outcomes: list) -> bool:
    """Some ranks refused and others did not."""
    return len({o.kind for o in outcomes}) > 1


def _fuzz_group(level: dist.DebugLevel) -> Any:
    before = dist.get_debug_level()
    dist.set_debug_level(level)
    try:
        return dist.new_group(list(range(dist.get_world_size())), timeout=DEADLINE)
    finally:
        dist.set_debug_level(before)


@pytest.fixture(scope="module", autouse=True)
def _hypothesis_home():
    """hypothesis keeps a cache (.hypothesis/ in the working directory): here in a directory of our own."""
    from hypothesis.configuration import set_hypothesis_home_dir

    home = tempfile.mkdtemp(prefix="hpc_c10d-fuzz-")
    set_hypothesis_home_dir(home)
    yield
    set_hypothesis_home_dir(None)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def fuzz_groups(world):
    groups = {"DETAIL": _fuzz_group(dist.DebugLevel.DETAIL), "OFF": _fuzz_group(dist.DebugLevel.OFF)}
    yield groups
    for group in groups.values():
        dist.destroy_process_group(group)


def _run_at(call: Call, level: str, groups: dict, rank: int, size: int, mixed: bool = False) -> list:
    """``call`` at ``level``, judged; ``mixed`` (at OFF): on a group of its own, unusable after."""
    fresh = call.fresh_group or mixed
    group = _fuzz_group(getattr(dist.DebugLevel, level)) if fresh else groups[level]
    try:
        outcome = _outcome(call, rank, size, group)
    finally:
        if fresh:
            if not mixed:
                _drain(group.comm)
            dist.destroy_process_group(group)
    gathered: list = [None] * size
    dist.all_gather_object(gathered, tuple(outcome))  # the world's plain collective
    outcomes = [Outcome(*o) for o in gathered]
    _judge(call, level, outcomes, mixed)
    return outcomes


def _drain(comm: Any) -> None:
    """Receive what a refused example left unreceived (a send whose receiver refused), so that no
    message outlives its group: MPI may give a later group the freed one's context."""
    from mpi4py import MPI

    comm.Barrier()
    status = MPI.Status()
    while comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
        comm.Recv(bytearray(status.Get_count(MPI.BYTE)), status.Get_source(), status.Get_tag())


CLASSES: dict = {}  # (function, argument, value) -> the outcome: refusals of one argument alone
BEGIN, END = "<!-- fuzz classes: begin -->", "<!-- fuzz classes: end -->"


def _record(call: Call, outcomes: list) -> None:
    refused = [(name, arg.label) for name, arg in call.args.items() if not arg.valid]
    if len(refused) == 1:
        CLASSES.setdefault((call.function, *refused[0]), _class_of(outcomes))


def _class_of(outcomes: list) -> str:
    """What the ranks raised, numbers left out: "ValueError: ...", or per side when they differ."""
    sides = {}
    for rank, outcome in enumerate(outcomes):
        error, _, text = outcome.detail.partition(": ")
        head = "".join("N" if ch.isdigit() else ch for ch in text.split("\n")[0][:90])
        sides.setdefault(f"`{error}`: {head.strip()}".replace("|", "\\|"), []).append(rank)
    if len(sides) == 1:
        return next(iter(sides))
    named = {f"{'the others' if 'refused by' in side else 'refusing'}: {side}" for side in sides}
    return "; ".join(sorted(named))  # "refusing: ..." first


def render_classes() -> str:
    """docs/bad_input.md's generated section: the classes the fuzz met, sorted."""
    rows = ["| function | argument | value drawn | every rank raised |", "|---|---|---|---|"]
    rows += [f"| `{function}` | {argument} | {value} | {raised} |"
             for (function, argument, value), raised in sorted(CLASSES.items())]
    return "\n".join(rows) + "\n"


def _write_classes(path: str) -> None:
    with open(path) as doc:
        text = doc.read()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    with open(path, "w") as doc:
        doc.write(text[:start] + "\n" + render_classes() + text[end:])


@pytest.mark.mpi
@pytest.mark.world_size(2, 3)
@pytest.mark.time_limit(300)
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_bad_input_fuzz(plan, fuzz_groups, rank, size, request):
    """The property above, for the calls one plan draws (see the module docstring)."""
    examples = request.config.getoption("--fuzz-examples")
    seed = request.config.getoption("--fuzz-seed")
    if plan == "checkpoint":
        pytest.importorskip("h5py", reason="h5py is not installed (pip install h5py)")
        SHARED["dir"] = str(request.getfixturevalue("tmp_path_factory").mktemp("fuzz") if rank == 0 else "")
        gathered = [SHARED["dir"]]
        dist.broadcast_object_list(gathered, src=0)
        SHARED["dir"] = gathered[0]

    @hypothesis.settings(max_examples=examples, derandomize=seed is None, database=None, deadline=None,
                         suppress_health_check=list(hypothesis.HealthCheck), print_blob=False,
                         phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])
    @hypothesis.given(PLANS[plan](size))
    def check(call):
        outcomes = _run_at(call, "DETAIL", fuzz_groups, rank, size)
        _record(call, outcomes)
        _run_at(call, "OFF", fuzz_groups, rank, size, mixed=_mixed(outcomes))

    (check if seed is None else hypothesis.seed(seed)(check))()
    assert_in_sync()


@pytest.fixture(scope="module", autouse=True)
def _classes_written(request, world):
    """With ``--fuzz-classes PATH``: after the plans ran, rank 0 writes their classes into PATH."""
    yield
    path = request.config.getoption("--fuzz-classes")
    if path and dist.get_rank() == 0 and CLASSES:
        _write_classes(path)
