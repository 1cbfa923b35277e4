"""Single-process behaviour (world size 1, no mpiexec) and argument validation: the
API works as one rank, and bad input fails with clear errors before anything is sent."""

from __future__ import annotations

import pytest
import torch

import ortcpu_torch.distributed as dist
from ortcpu_torch import kernels
from ortcpu_torch.distributed import _mpi


@pytest.fixture
def no_mpi4py(monkeypatch):
    """Pretend mpi4py is not installed."""
    monkeypatch.setattr(_mpi, "_MPI", False)


def test_single_process_world():
    assert dist.rank() == 0 and dist.world_size() == 1 and dist.is_main_process()
    dist.barrier()
    t = torch.arange(6.0).reshape(2, 3)
    assert dist.allreduce_(t, "mean") is t and torch.equal(t, torch.arange(6.0).reshape(2, 3))
    assert dist.allreduce_(t, "sum") is t and torch.equal(t, torch.arange(6.0).reshape(2, 3))
    assert dist.broadcast_(t) is t


def test_data_parallel_single_process_is_transparent():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    ref = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    ref.load_state_dict(model.state_dict())
    ddp = dist.DataParallel(model)
    assert set(ddp.state_dict()) == {f"module.{k}" for k in model.state_dict()}
    x = torch.randn(3, 5)
    ddp(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    with ddp.no_sync():
        ddp(x).sum().backward()


def test_data_parallel_find_unused_parameters_must_be_bool():
    with pytest.raises(TypeError, match="find_unused_parameters must be a bool"):
        dist.DataParallel(torch.nn.Linear(2, 2), find_unused_parameters="yes")


def test_single_process_without_mpi4py(no_mpi4py):
    assert not dist.available()
    assert dist.rank() == 0 and dist.world_size() == 1
    t = torch.ones(3)
    dist.allreduce_(t, "mean")
    dist.broadcast_(t)
    dist.barrier()
    dist.DataParallel(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"pip install ortcpu-torch\[mpi\]"):
        dist.send(t, 1)
    with pytest.raises(ValueError, match=r"pip install ortcpu-torch\[mpi\]"):
        dist.irecv(1)
    with pytest.raises(ImportError, match=r"pip install ortcpu-torch\[mpi\]"):
        _mpi.comm()


def test_same_rank_and_range_errors():
    t = torch.ones(2)
    with pytest.raises(ValueError, match="own rank"):
        dist.send(t, 0)
    with pytest.raises(ValueError, match="own rank"):
        dist.recv(0)
    with pytest.raises(ValueError, match=r"rank in \[0, 0\]"):
        dist.isend(t, 3)
    with pytest.raises(TypeError, match="dst must be an int"):
        dist.send(t, 1.0)
    with pytest.raises(ValueError, match="own rank"):
        kernels.Send(torch.tensor(True), torch.tensor(0), t, tag=0, element_types=[1])
    with pytest.raises(ValueError, match="own rank"):
        kernels.Recv(torch.tensor(True), torch.tensor(0), tag=0, element_types=[1])


def test_argument_validation():
    t = torch.ones(2)
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor"):
        dist.send([1, 2], 1)
    with pytest.raises(ValueError, match="tag must be in"):
        dist.send(t, 1, tag=-1)
    with pytest.raises(ValueError, match="op must be"):
        dist.allreduce_(t, "avg")
    with pytest.raises(TypeError, match="mean"):
        dist.allreduce_(torch.ones(2, dtype=torch.int32), "mean")
    with pytest.raises(TypeError, match="cannot reduce dtype bool"):
        dist.allreduce_(torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="requires grad"):
        dist.allreduce_(torch.ones(2, requires_grad=True))
    with pytest.raises(ValueError, match="root must be a rank"):
        dist.broadcast_(t, root=1)
    with pytest.raises(ValueError, match="bucket_mb"):
        dist.DataParallel(torch.nn.Linear(2, 2), bucket_mb=0)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        dist.DataParallel(lambda x: x)


def test_kernel_argument_validation():
    sig = torch.tensor(True)
    x = torch.ones(2)
    with pytest.raises(ValueError, match="InputSignal must be true"):
        kernels.Send(torch.tensor(False), 1, x, tag=0, element_types=[1])
    with pytest.raises(TypeError, match="InputSignal must be a bool scalar"):
        kernels.Send(torch.tensor(1.0), 1, x, tag=0, element_types=[1])
    with pytest.raises(TypeError, match="tag is a required attribute"):
        kernels.Send(sig, 1, x, element_types=[1])
    with pytest.raises(TypeError, match="element_types is a required attribute"):
        kernels.Send(sig, 1, x, tag=0)
    with pytest.raises(ValueError, match="2 entries for 1 Data"):
        kernels.Send(sig, 1, x, tag=0, element_types=[1, 1])
    with pytest.raises(TypeError, match=r"Data\[0\] has dtype float32 but element_types\[0\]"):
        kernels.Send(sig, 1, x, tag=0, element_types=[11])
    with pytest.raises(ValueError, match="ONNX TensorProto dtype code"):
        kernels.Recv(sig, 1, tag=0, element_types=[8])  # 8 = STRING
    with pytest.raises(ValueError, match="at least one Data"):
        kernels.Send(sig, 1, tag=0, element_types=[])


def test_wire_layout_aligns_to_256_bytes():
    specs = [(torch.float32, (5,)), (torch.int64, (3,)), (torch.bool, ()), (torch.float64, (0,))]
    offsets, total = _mpi.layout(specs)
    assert offsets == [0, 256, 512, 768] and total == 768
    p = _mpi.Parcel("t", [torch.arange(5.0), torch.arange(3), torch.tensor(True)])
    assert p.data.size == 513
    flags, got, nbytes = _mpi.decode_header("t", p.header, p.header.size, 1, 0)
    assert got == specs[:3] and nbytes == 513 and flags == 0
    # a single non-contiguous tensor is sent contiguous, in logical order
    q = _mpi.Parcel("t", [torch.arange(6.0).reshape(2, 3).t()])
    assert q.data.view("float32").tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    with pytest.raises(RuntimeError, match="not an ortcpu_torch tensor header"):
        _mpi.decode_header("t", [1, 2, 3, 4, 5], 5, 1, 0)


def test_summary_rank_source_is_installed():
    from ortcpu_torch import summary
    from ortcpu_torch.summary import _rank

    assert _rank._source is dist.summary_rank
    assert summary.get_rank() == 0 == dist.summary_rank()
