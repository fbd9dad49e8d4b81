"""Collectives with gradients through backend "hpc": ``torch.distributed.nn.functional`` and
``torch.distributed._functional_collectives`` (their autograd forms and the plain ones).

Each forward result is checked against what every rank contributed, and each gradient against the
one worked out by hand from the collective's adjoint: rank r weights its outputs by (r + 1), so a
wrong routing of gradients between ranks shows in the numbers.
"""
import pytest

from support.torch_world import tdist, torch, torch_world

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", autouse=True)
def world():
    return torch_world()


_rank, _size = tdist.get_rank, tdist.get_world_size


def _weights_total():
    """The sum over ranks of each rank's weight (r + 1)."""
    return sum(r + 1 for r in range(_size()))


def _leaf(rank, n=4):
    """Rank ``rank``'s input: n values that tell ranks and positions apart."""
    return (torch.arange(n, dtype=torch.float64) + 10 * rank).requires_grad_()


def test_nn_all_reduce_sums_values_and_gradients():
    import torch.distributed.nn.functional as dnn

    x = _leaf(_rank())
    y = dnn.all_reduce(x)
    torch.testing.assert_close(y.detach(), sum(_leaf(r).detach() for r in range(_size())))
    (y * (_rank() + 1)).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), float(_weights_total()), dtype=torch.float64))


def test_nn_all_gather_gives_every_rank_each_gradient_it_caused():
    import torch.distributed.nn.functional as dnn

    x = _leaf(_rank())
    parts = dnn.all_gather(x)
    for r, part in enumerate(parts):
        torch.testing.assert_close(part.detach(), _leaf(r).detach())
    sum(((k + 1) * (_rank() + 1) * part).sum() for k, part in enumerate(parts)).backward()
    torch.testing.assert_close(x.grad, torch.full((4,), float((_rank() + 1) * _weights_total()), dtype=torch.float64))


def test_nn_broadcast_sends_gradients_back_to_the_source():
    import torch.distributed.nn.functional as dnn

    src = _size() - 1
    x = _leaf(_rank())
    y = dnn.broadcast(x, src)
    torch.testing.assert_close(y.detach(), _leaf(src).detach())
    (y * (_rank() + 1)).sum().backward()
    expected = float(_weights_total()) if _rank() == src else 0.0
    torch.testing.assert_close(x.grad, torch.full((4,), expected, dtype=torch.float64))


def test_nn_reduce_scatter_and_its_gradient():
    import torch.distributed.nn.functional as dnn

    inputs = [(torch.full((3,), float(10 * _rank() + k), dtype=torch.float64)).requires_grad_() for k in range(_size())]
    out = torch.empty(3, dtype=torch.float64)
    y = dnn.reduce_scatter(out, inputs)
    torch.testing.assert_close(y.detach(), torch.full((3,), float(sum(10 * r + _rank() for r in range(_size()))),
                                                      dtype=torch.float64))
    (y * (_rank() + 1)).sum().backward()
    for k, inp in enumerate(inputs):  # block k went to rank k, whose weight is k + 1
        torch.testing.assert_close(inp.grad, torch.full((3,), float(k + 1), dtype=torch.float64))


def _check_all_to_all_routes_gradients_back(exchange):
    """``exchange(x)``, an all_to_all_single of one element per rank with autograd: element k of
    ``x`` goes to rank k, and the gradient each rank puts on what it received comes back to it."""
    x = (torch.arange(_size(), dtype=torch.float64) + 10 * _rank()).requires_grad_()
    y = exchange(x)
    torch.testing.assert_close(y.detach(), torch.tensor([10.0 * r + _rank() for r in range(_size())],
                                                        dtype=torch.float64))
    (y * (_rank() + 1)).sum().backward()
    torch.testing.assert_close(x.grad, torch.arange(1, _size() + 1, dtype=torch.float64))


def test_nn_all_to_all_single_routes_gradients_back():
    import torch.distributed.nn.functional as dnn

    _check_all_to_all_routes_gradients_back(lambda x: dnn.all_to_all_single(torch.empty(_size(), dtype=x.dtype), x))


def test_functional_collectives_autograd_forms():
    import torch.distributed._functional_collectives as funcol

    world = tdist.group.WORLD
    x = _leaf(_rank())
    gathered = funcol.all_gather_tensor_autograd(x, 0, world)
    torch.testing.assert_close(gathered.detach(), torch.cat([_leaf(r).detach() for r in range(_size())]))
    (gathered * (_rank() + 1)).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), float(_weights_total()), dtype=torch.float64))

    z = (torch.arange(2 * _size(), dtype=torch.float64) + _rank()).requires_grad_()
    scattered = funcol.reduce_scatter_tensor_autograd(z, "sum", 0, world)
    block = torch.arange(2 * _rank(), 2 * _rank() + 2, dtype=torch.float64)
    torch.testing.assert_close(scattered.detach(), _size() * block + sum(range(_size())))
    (scattered * (_rank() + 1)).sum().backward()
    torch.testing.assert_close(z.grad, torch.arange(1, _size() + 1, dtype=torch.float64).repeat_interleave(2))

    _check_all_to_all_routes_gradients_back(lambda w: funcol.all_to_all_single_autograd(w, None, None, world))


def test_functional_collectives_plain_forms():
    import torch.distributed._functional_collectives as funcol

    world = tdist.group.WORLD
    z = torch.arange(2 * _size(), dtype=torch.float32) + _rank()
    block = torch.arange(2 * _rank(), 2 * _rank() + 2, dtype=torch.float32)
    torch.testing.assert_close(funcol.reduce_scatter_tensor(z, "sum", 0, world), _size() * block + sum(range(_size())))
    w = torch.arange(_size(), dtype=torch.float32) + 10 * _rank()
    torch.testing.assert_close(funcol.all_to_all_single(w, None, None, world),
                               torch.tensor([10.0 * r + _rank() for r in range(_size())]))
    torch.testing.assert_close(funcol.broadcast(w, 0, world), torch.arange(_size(), dtype=torch.float32))
    torch.testing.assert_close(funcol.all_reduce(w, "max", world), torch.arange(_size(), dtype=torch.float32)
                               + 10 * (_size() - 1))
