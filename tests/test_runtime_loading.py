"""runtime/loading.py: each tensor read once, straight into the compute dtype on the device.

Every path of the loader against the safetensors library's own reading of the same file:
stored BF16/F16/F32 into float32 and bfloat16 (the CPU's direct read and its staging
conversion, tensors larger than one staging chunk), the SHA-256 of the stored bytes, and
a file that shrinks after its header was read.
"""

from __future__ import annotations


import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_convert.errors import RuntimeTargetError
from dspark_convert.runtime import loading
from dspark_convert.runtime.loading import STORED_DTYPES, StoredTensor, TensorLoader, compute_dtype
from dspark_convert.formats.safetensors import read_safetensors_header

CPU = torch.device("cpu")


def _truncated(spec):
    return RuntimeTargetError(f"{spec.name} truncated", tensor=spec.name)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """One file with a tensor of each stored dtype; the big one spans several chunks."""
    gen = torch.Generator().manual_seed(3)
    tensors = {
        "big": (torch.randn(300, 70, generator=gen) * 5).to(torch.bfloat16),
        "norm": torch.randn(70, generator=gen).to(torch.bfloat16),
        "half": torch.randn(33, 17, generator=gen).to(torch.float16),
        "full": torch.randn(9, 5, generator=gen),
    }
    path = tmp_path_factory.mktemp("stored") / "m.safetensors"
    save_file(tensors, path)
    header = read_safetensors_header(path)
    specs = {e.name: StoredTensor(name=e.name, file=path, offset=e.begin, nbytes=e.nbytes,
                                  dtype=STORED_DTYPES[e.dtype], shape=e.shape)
             for e in header.tensors}
    return path, specs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [loading.STAGING_BYTES, 1000])
def test_values_equal_the_library_reading(stored, monkeypatch, dtype, chunk):
    """A 1000-byte staging chunk makes the 300-row BF16 tensor take 43 chunks of 7 rows."""
    monkeypatch.setattr(loading, "STAGING_BYTES", chunk)
    path, specs = stored
    want = load_file(path)
    with TensorLoader(device=CPU, dtype=dtype, truncated=_truncated) as loader:
        for name, spec in specs.items():
            got = loader.load(spec)
            assert got.dtype == dtype and got.device.type == "cpu" and got.shape == want[name].shape
            assert torch.equal(got, want[name].to(dtype)), name


def test_bf16_into_float32_is_exact(stored):
    """BF16 widens to float32 exactly: the float32 model holds the stored values."""
    path, specs = stored
    with TensorLoader(device=CPU, dtype=torch.float32, truncated=_truncated) as loader:
        got = loader.load(specs["big"])
    assert torch.equal(got.to(torch.bfloat16).float(), got)


def test_progress_counts_every_stored_byte(stored):
    class Count:
        total = 0

        def start(self, label, total):
            pass

        def advance(self, n):
            self.total += n

        def finish(self):
            pass

    path, specs = stored
    progress = Count()
    with TensorLoader(device=CPU, dtype=torch.bfloat16, truncated=_truncated,
                      progress=progress) as loader:
        for spec in specs.values():
            loader.load(spec)
    assert progress.total == sum(s.nbytes for s in specs.values())


def test_a_file_that_shrank_is_refused(stored, tmp_path):
    path, specs = stored
    copy = tmp_path / "m.safetensors"
    copy.write_bytes(path.read_bytes()[:-10])          # the last tensor loses 10 bytes
    last = max(specs.values(), key=lambda s: s.offset)
    spec = StoredTensor(name=last.name, file=copy, offset=last.offset, nbytes=last.nbytes,
                        dtype=last.dtype, shape=last.shape)
    with TensorLoader(device=CPU, dtype=torch.float32, truncated=_truncated) as loader:
        with pytest.raises(RuntimeTargetError, match=f"{last.name} truncated"):
            loader.load(spec)


def test_compute_dtype_names():
    assert compute_dtype("float32") is torch.float32
    assert compute_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(Exception, match="--dtype: expected one of float32, bfloat16, found 'float16'") as info:
        compute_dtype("float16")
    assert info.value.exit_code == 73


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device on this machine (CPU-only torch or no GPU)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loads_onto_cuda(stored, monkeypatch, dtype):
    """On CUDA the tensor is allocated on the device; the bytes pass through one pinned
    staging chunk (converted on the device when the dtypes differ)."""
    monkeypatch.setattr(loading, "STAGING_BYTES", 1000)
    path, specs = stored
    want = load_file(path)
    cuda = torch.device("cuda")
    with TensorLoader(device=cuda, dtype=dtype, truncated=_truncated) as loader:
        for name, spec in specs.items():
            got, _ = loader.load(spec)
            assert got.device.type == "cuda" and got.dtype == dtype
            assert torch.equal(got.cpu(), want[name].to(dtype)), name
