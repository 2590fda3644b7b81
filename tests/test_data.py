"""The dataset registry: cache, integrity, `auto`, official-file decoding and offline errors.

Official files are replaced by small files in the same formats, served from file:// URLs (the
project's machines have no internet); the generator runs for real on a small sample count.
"""

import gzip
import io
import pickle
import socket
import tarfile

import numpy as np
import pytest

from mgpu.runtime import data, download, synthetic


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MGPU_DATA_DIR", str(tmp_path / "cache"))
    calls = []
    real_generate = synthetic.generate

    def small_generate(seed=0):
        calls.append(seed)
        return real_generate(seed=seed, n_train=500, n_test=100)

    monkeypatch.setattr(synthetic, "generate", small_generate)
    return calls


def _idx_gz(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def _serve_as_official(monkeypatch, tmp_path, name, blobs):
    """Put ``blobs`` (file name -> bytes) behind file:// URLs and point OFFICIAL_FILES at them."""
    mirror = tmp_path / "mirror"
    mirror.mkdir(exist_ok=True)
    entries = []
    for file_name, blob in blobs.items():
        (mirror / file_name).write_bytes(blob)
        entries.append((file_name, (mirror / file_name).as_uri(), download.sha256_file(mirror / file_name)))
    monkeypatch.setitem(data.OFFICIAL_FILES, name, entries)


def _fake_fashion(monkeypatch, tmp_path, seed=1):
    rng = np.random.default_rng(seed)
    arrays = (rng.integers(0, 256, (30, 28, 28)), rng.integers(0, 10, 30),
              rng.integers(0, 256, (7, 28, 28)), rng.integers(0, 10, 7))
    files = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
    _serve_as_official(monkeypatch, tmp_path, "fashion_mnist",
                       {f: _idx_gz(a) for f, a in zip(files, arrays)})
    return arrays


def test_synthetic_is_cached_and_reused(isolated_cache, capsys):
    first = data.load("synthetic", verbose=True)
    second = data.load("synthetic", verbose=False)
    assert isolated_cache == [0]  # generated once, then read from the cache
    assert first.fingerprint == second.fingerprint
    assert first.fingerprint.startswith(f"synthetic-v{data.SYNTHETIC_VERSION}-seed0:")
    np.testing.assert_array_equal(first.x_train, second.x_train)
    assert first.image_shape == (28, 28, 1) and first.num_classes == 10 and not first.real
    assert "Generating the offline dataset" in capsys.readouterr().out


def test_a_damaged_cache_is_rebuilt_not_trusted(isolated_cache):
    good = data.load("synthetic", verbose=False)
    cached = data.cache_dir() / f"synthetic-v{data.SYNTHETIC_VERSION}-seed0.npz"
    # Half a file (a killed write would look like this if it were not atomic) ...
    cached.write_bytes(cached.read_bytes()[: cached.stat().st_size // 2])
    assert data.load("synthetic", verbose=False).fingerprint == good.fingerprint
    # ... and a well-formed file whose pixels were edited.
    with np.load(cached) as npz:
        arrays = {k: npz[k].copy() for k in npz.files}
    arrays["x_train"][0, 0, 0] ^= 0xFF
    np.savez(cached, **arrays)
    again = data.load("synthetic", verbose=False)
    assert again.fingerprint == good.fingerprint
    assert isolated_cache == [0, 0, 0]


def test_seed_selects_a_different_generated_set():
    assert data.load("synthetic", seed=0, verbose=False).fingerprint != \
        data.load("synthetic", seed=1, verbose=False).fingerprint


def test_fingerprint_sees_every_pixel_and_the_name():
    x = np.zeros((4, 28, 28), np.uint8)
    y = np.arange(4, dtype=np.uint8)
    base = data.fingerprint("a", x, y)
    x2 = x.copy()
    x2[3, 27, 27] = 1
    assert data.fingerprint("a", x2, y) != base
    assert data.fingerprint("b", x, y) != base
    assert data.fingerprint("a", x, y) == base


def test_auto_uses_generated_data_when_nothing_is_cached(monkeypatch, tmp_path, capsys):
    _fake_fashion(monkeypatch, tmp_path)  # available, but not downloaded: auto must not fetch
    dataset = data.load("auto")
    out = capsys.readouterr().out
    assert dataset.name.startswith("synthetic") and not dataset.real
    assert "Dataset: synthetic" in out and "python -m mgpu.runtime.data download fashion_mnist" in out
    assert not (data.cache_dir() / "fashion_mnist").exists()


def test_fashion_mnist_is_downloaded_verified_decoded_and_then_preferred(monkeypatch, tmp_path, capsys):
    x_train, y_train, x_test, y_test = _fake_fashion(monkeypatch, tmp_path)
    dataset = data.load("fashion_mnist", verbose=False)
    np.testing.assert_array_equal(dataset.x_train, x_train)
    np.testing.assert_array_equal(dataset.y_train, y_train)
    np.testing.assert_array_equal(dataset.x_test, x_test)
    np.testing.assert_array_equal(dataset.y_test, y_test)
    assert dataset.real and dataset.class_names[0] == "T-shirt/top"
    assert data.is_cached("fashion_mnist")
    auto = data.load("auto")
    assert auto.name == "fashion_mnist" and auto.fingerprint == dataset.fingerprint
    assert "Fashion-MNIST found in" in capsys.readouterr().out


def test_a_tampered_official_file_is_not_cached(monkeypatch, tmp_path):
    _fake_fashion(monkeypatch, tmp_path)
    data.fetch_official("fashion_mnist", progress=False)
    target = data.cache_dir() / "fashion_mnist" / "t10k-labels-idx1-ubyte.gz"
    target.write_bytes(b"not the labels")
    assert not data.is_cached("fashion_mnist")
    with pytest.raises(data.DatasetUnavailable, match="python -m mgpu.runtime.data download fashion_mnist"):
        data.load_official("fashion_mnist", download_if_missing=False)


def test_cifar10_archive_is_decoded_to_nhwc_in_batch_order(monkeypatch, tmp_path):
    rng = np.random.default_rng(0)
    batches = {}
    for name in ["data_batch_2", "data_batch_1", "test_batch"]:  # stored out of order on purpose
        batches[name] = {b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8),
                         b"labels": list(rng.integers(0, 10, 3))}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, batch in batches.items():
            blob = pickle.dumps(batch)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    _serve_as_official(monkeypatch, tmp_path, "cifar10", {"cifar-10-python.tar.gz": buffer.getvalue()})
    dataset = data.load("cifar10", verbose=False)
    assert dataset.x_train.shape == (6, 32, 32, 3) and dataset.x_test.shape == (3, 32, 32, 3)
    first = batches["data_batch_1"][b"data"][0]
    # channel-major rows become height x width x channel
    assert dataset.x_train[0, 0, 0].tolist() == [first[0], first[1024], first[2048]]
    assert dataset.y_train.tolist()[:3] == [int(v) for v in batches["data_batch_1"][b"labels"]]
    assert (data.cache_dir() / "cifar10" / "decoded.npz").exists()
    assert data.load("cifar10", verbose=False).fingerprint == dataset.fingerprint


def test_offline_error_is_one_line_naming_what_to_download_and_where(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    url = f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"
    monkeypatch.setitem(data.OFFICIAL_FILES, "cifar10", [("cifar-10-python.tar.gz", url, "0" * 64)])
    with pytest.raises(data.DatasetUnavailable) as error:
        data.load("cifar10", verbose=False)
    message = str(error.value)
    assert "\n" not in message
    assert url in message and str(data.cache_dir() / "cifar10") in message


def test_unknown_name_is_refused():
    with pytest.raises(data.DatasetUnavailable, match="choose one of auto, fashion_mnist"):
        data.load("imagenet")


def test_command_line_info(capsys):
    assert data.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "fashion_mnist: not cached" in out and "auto uses: synthetic" in out
