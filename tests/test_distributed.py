"""Two gloo processes against one: the gathered loss and every gradient equal the single-process batch."""

import os
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from conftest import free_port, spawn_gloo
from openalign.config import LossConfig
from train.test_step import direct_reference, grads, make_batch, make_model

WORLD = 2


def join(rank: int, port: int) -> None:
    """This process as `rank` of a WORLD-process gloo group on loopback, one thread each."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)


def leave() -> None:
    """End this worker once every rank has saved its results, skipping teardown: freeing DDP's Reducer
    runs ProcessGroupGloo's destructor, which can hang on a lock (pytorch/pytorch#75097; seen here)."""
    import torch.distributed as dist

    dist.barrier()
    os._exit(0)


def worker(rank: int, port: int, out: str, micro_batch: int, implementation: str, direction: str, kind: str) -> None:
    import torch.distributed.nn.functional as dist_fn

    from openalign import distributed
    from openalign.train.step import forward_backward

    join(rank, port)
    gathers = []
    real = dist_fn.all_gather
    dist_fn.all_gather = lambda x, *a, **k: gathers.append(tuple(x.shape)) or real(x, *a, **k)
    loss_cfg = LossConfig(kind=kind.split("-")[0], label_smoothing=0.1, implementation=implementation,
                          direction=direction, exchange="ring" if kind.endswith("-ring") else "gather")
    model = make_model(loss=loss_cfg)
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    layout = distributed.from_env()
    losses = []
    for step in range(2):  # a second step: DDP would fail on a parameter without gradient
        batch = {k: v.chunk(WORLD)[rank] for k, v in make_batch(seed=step + 1).items()}
        model.zero_grad(set_to_none=True)
        loss = forward_backward(ddp, model, batch, loss_cfg, micro_batch, layout, torch.device("cpu"), nullcontext)
        losses.append(distributed.mean_over_ranks(loss.item(), layout))
    torch.save({"losses": losses, "grads": grads(model), "gathers": gathers}, Path(out) / f"rank{rank}.pt")
    leave()


@pytest.mark.parametrize("micro_batch,implementation,direction,kind", [
    (0, "naive", "both", "softmax"), (0, "chunked", "both", "softmax"), (2, "naive", "both", "softmax"),
    (0, "chunked", "image_to_text", "softmax"),
    (0, "naive", "both", "filip"), (0, "naive", "image_to_text", "filip"),
    (0, "naive", "both", "sigmoid"), (0, "chunked", "both", "sigmoid"), (2, "chunked", "both", "sigmoid"),
    (2, "naive", "both", "sigmoid-ring")])
def test_two_processes_equal_the_single_process_batch(tmp_path, micro_batch, implementation, direction, kind):
    spawn_gloo(worker, lambda port: (port, str(tmp_path), micro_batch, implementation, direction, kind), WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    # the reference: one process, the whole batch, BatchNorm per device batch (per micro-batch with caching)
    loss_cfg = LossConfig(kind=kind.split("-")[0], label_smoothing=0.1, implementation="naive", direction=direction)
    parts = 8 // micro_batch if micro_batch else WORLD
    model = make_model(loss=loss_cfg)
    losses = []
    for step in range(2):
        model.zero_grad(set_to_none=True)
        losses.append(direct_reference(model, make_batch(seed=step + 1), parts, loss_cfg).item())
    reference = grads(model)
    for rank in ranks:
        assert rank["losses"] == pytest.approx(losses, abs=1e-6)
        assert rank["grads"].keys() == reference.keys()
        for name, g in reference.items():
            torch.testing.assert_close(rank["grads"][name], g, rtol=1e-6, atol=1e-9, msg=name)
        if kind == "softmax":
            assert rank["gathers"] == [(4, 80), (4, 80)] * 2  # one all_gather per modality per step
        if kind == "sigmoid":
            assert rank["gathers"] == [(4, 80)] * 2  # the texts alone, once a step
        if kind == "sigmoid-ring":
            assert rank["gathers"] == []  # passed between neighbours instead


def zero_worker(rank: int, port: int, out: str) -> None:

    from openalign import distributed, presets
    from openalign.train.optim import build_optimizer, full_state_dict, set_lr
    from openalign.train.step import forward_backward

    join(rank, port)
    cfg = presets.get("tiny")
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    optimizer = build_optimizer(model, cfg.optim, shard_optimizer=True)
    for step in range(2):
        set_lr(optimizer, 1e-2)
        optimizer.zero_grad(set_to_none=True)
        batch = {k: v.chunk(WORLD)[rank] for k, v in make_batch(seed=step + 1).items()}
        forward_backward(ddp, model, batch, cfg.loss, 0, distributed.from_env(), torch.device("cpu"), nullcontext)
        optimizer.step()
    state = full_state_dict(optimizer, rank == 0)
    if rank == 0:
        torch.save({"params": {n: p.detach() for n, p in model.named_parameters()}, "state": state},
                   Path(out) / "zero.pt")
    leave()


def test_sharded_lamb_state_gives_the_single_process_lamb_steps(tmp_path):
    from openalign import presets
    from openalign.train.optim import build_optimizer, set_lr

    spawn_gloo(zero_worker, lambda port: (port, str(tmp_path)), WORLD)
    sharded = torch.load(tmp_path / "zero.pt", weights_only=False)
    cfg = presets.get("tiny")
    model = make_model()
    optimizer = build_optimizer(model, cfg.optim)
    for step in range(2):
        set_lr(optimizer, 1e-2)
        optimizer.zero_grad(set_to_none=True)
        direct_reference(model, make_batch(seed=step + 1), WORLD, LossConfig(implementation="naive"))
        optimizer.step()
    for name, p in model.named_parameters():
        torch.testing.assert_close(sharded["params"][name], p.detach(), rtol=1e-8, atol=1e-10, msg=name)
    # the consolidated state is the whole LAMB state: two moments for every parameter
    assert len(sharded["state"]["state"]) == len(optimizer.state_dict()["state"])


def fsdp_worker(rank: int, port: int, out: str, micro_batch: int, grad_clip: float) -> None:

    from openalign import distributed, presets
    from openalign.train import fsdp
    from openalign.train.optim import FsdpLamb, build_optimizer, set_lr
    from openalign.train.step import forward_backward

    join(rank, port)
    cfg = presets.get("tiny")
    model = make_model()
    fsdp.wrap(model)
    optimizer = build_optimizer(model, cfg.optim, fsdp=True)
    assert isinstance(optimizer, FsdpLamb)
    for step in range(2):
        set_lr(optimizer, 1e-2)
        optimizer.zero_grad(set_to_none=True)
        batch = {k: v.chunk(WORLD)[rank] for k, v in make_batch(seed=step + 1).items()}
        forward_backward(model, model, batch, cfg.loss, micro_batch, distributed.from_env(), torch.device("cpu"),
                         nullcontext)
        if grad_clip:
            fsdp.clip_grad_norm_(model, grad_clip)
        optimizer.step()
    sharded = sum(p.to_local().numel() for p in model.parameters() if p.ndim)  # this rank's share
    params, state = fsdp.model_state(model), fsdp.optimizer_state(model, optimizer)
    whole = fsdp.whole_copy(model, cfg.loss)
    if rank == 0:
        torch.save({"params": params, "state": state, "sharded": sharded,
                    "copy": {n: p.detach() for n, p in whole.named_parameters()}}, Path(out) / "fsdp.pt")
    leave()


@pytest.mark.parametrize("micro_batch,grad_clip", [(0, 0.0), (2, 0.5)])
def test_fsdp_with_lamb_gives_the_single_process_lamb_steps(tmp_path, micro_batch, grad_clip):
    """FSDP2 shards the towers over two processes; two LAMB steps (direct, or gradient-cached with
    clipping) end at the parameters of single-process pytorch-optimizer Lamb on the whole batch."""
    from pytorch_optimizer import Lamb

    from openalign import presets
    from openalign.train.optim import build_optimizer, set_lr

    spawn_gloo(fsdp_worker, lambda port: (port, str(tmp_path), micro_batch, grad_clip), WORLD)
    sharded = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    cfg = presets.get("tiny")
    model = make_model()
    optimizer = build_optimizer(model, cfg.optim)
    assert isinstance(optimizer, Lamb)
    for step in range(2):
        set_lr(optimizer, 1e-2)
        optimizer.zero_grad(set_to_none=True)
        direct_reference(model, make_batch(seed=step + 1), 8 // micro_batch if micro_batch else WORLD,
                         LossConfig(implementation="naive"))
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
    total = sum(p.numel() for p in model.parameters() if p.ndim)
    assert sharded["sharded"] <= total // WORLD + 1000  # each rank holds about half
    for name, p in model.named_parameters():
        torch.testing.assert_close(sharded["params"][name], p.detach(), rtol=1e-6, atol=1e-9, msg=name)
        torch.testing.assert_close(sharded["copy"][name], p.detach(), rtol=1e-6, atol=1e-9, msg=name)
    # the whole optimizer state: two moments for every parameter, by name
    assert len(sharded["state"]["state"]) == len(optimizer.state_dict()["state"])


def sigmoid_worker(rank: int, world: int, port: int, out: str, implementation: str, exchange: str) -> None:
    """This rank's share of the gathered sigmoid loss on its slice of a 12-pair fp64 batch, and its gradients."""
    import torch.distributed as dist

    from openalign.loss import base, sigmoid

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base.CHUNK_BYTES = 8 * 12 * 2  # chunked: blocks of 2 rows of the 12 gathered texts
    img, txt, t, bias = sigmoid_batch()
    n = 12 // world
    img, txt = img[rank * n:(rank + 1) * n].clone().requires_grad_(), txt[rank * n:(rank + 1) * n].clone().requires_grad_()
    t, bias = t.clone().requires_grad_(), bias.clone().requires_grad_()
    shares = {"gather": sigmoid.gathered_sigmoid_loss, "ring": sigmoid.ring_sigmoid_loss}
    loss = shares[exchange](img, txt, t, bias, implementation)
    loss.backward()
    scalars = torch.stack([loss.detach(), t.grad, bias.grad])
    dist.all_reduce(scalars)  # the mean over ranks is the single-process loss, and its scalars' gradients
    torch.save({"scalars": scalars / world, "img": img.grad / world, "txt": txt.grad / world},
               Path(out) / f"sigmoid{rank}.pt")
    dist.barrier()
    os._exit(0)


def sigmoid_batch():
    g = torch.Generator().manual_seed(11)
    unit = lambda: torch.nn.functional.normalize(torch.randn(12, 8, generator=g, dtype=torch.float64), dim=1)  # noqa: E731
    return unit(), unit(), torch.tensor(0.1, dtype=torch.float64), torch.tensor(-2.5, dtype=torch.float64)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("implementation,exchange", [("naive", "gather"), ("chunked", "gather"), ("naive", "ring"),
                                                     ("chunked", "ring")])
def test_the_sigmoid_loss_over_ranks_and_its_gradients_equal_one_process_on_the_whole_batch(tmp_path, world, implementation,
                                                                                      exchange):
    from openalign import loss as loss_lib

    spawn_gloo(sigmoid_worker, lambda port: (world, port, str(tmp_path), implementation, exchange), world)
    ranks = [torch.load(tmp_path / f"sigmoid{r}.pt") for r in range(world)]
    img, txt, t, bias = (x.clone().requires_grad_() for x in sigmoid_batch())
    loss = loss_lib.sigmoid_loss(img, txt, t, bias, "naive")
    loss.backward()
    expected = torch.stack([loss.detach(), t.grad, bias.grad])
    for rank in ranks:  # loss, d/d scale, d/d bias: the same on every rank
        torch.testing.assert_close(rank["scalars"], expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.cat([r["img"] for r in ranks]), img.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.cat([r["txt"] for r in ranks]), txt.grad, rtol=0, atol=1e-10)


def rendezvous_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    join(rank, port)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    torch.save(total, Path(out) / f"sum{rank}.pt")
    leave()


def test_a_port_taken_before_the_rendezvous_binds_it_is_replaced_by_another(tmp_path):
    # free_port() closes its socket, so another process may take the port before rank 0 binds it: the launch then
    # fails with EADDRINUSE (once, under load, in the suite). Here the first port is held by a listening socket.
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], free_port()])
        spawn_gloo(rendezvous_worker, lambda port: (port, str(tmp_path)), WORLD, ports=ports)
    assert next(ports, None) is None  # the second port was used
    assert [torch.load(tmp_path / f"sum{r}.pt").item() for r in range(WORLD)] == [3.0, 3.0]
