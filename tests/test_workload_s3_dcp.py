"""DCP's writer and reader on S3 as jobs/workload/s3_dcp.py makes them (the S3 Connector's writer, DCP's own reader
on boto3's ranged GETs), in one process (DCP without a process group) against a real moto S3."""

import boto3
import torch
import torch.distributed.checkpoint as dcp

from gpuyard.jobs.workload.engine import storage_reader, storage_writer
from gpuyard.jobs.workload.s3_dcp import LARGE_TENSOR, READ_WINDOW
from gpuyard.jobs.workload.storage import S3Storage
from workload_launch import FaultyProxy

LARGE = LARGE_TENSOR // 4 + 4096  # float32 elements: larger than LARGE_TENSOR, so read into its target


def test_each_item_restores_bitwise_into_the_tensors_given_whichever_path_reads_it_reading_each_once(
        local_aws, monkeypatch):
    """``large`` is read into its target; ``widened`` (saved float32, restored into float64) and ``small`` take
    DCP's own path (torch.load, then a copy), as does ``step`` (pickled bytes). The restore fetches about the
    checkpoint's bytes, counted by a proxy in front of moto."""
    boto3.client("s3").create_bucket(Bucket="ckpt")
    storage, checkpoint_id = S3Storage("ckpt", "run"), "s3://ckpt/run/ckpt-000000001"
    generator = torch.Generator().manual_seed(5)
    saved = {"large": torch.rand(LARGE, generator=generator), "widened": torch.rand(LARGE, generator=generator),
             "small": torch.rand(1000, generator=generator).reshape(10, 100), "step": 7}
    dcp.save(saved, checkpoint_id=checkpoint_id, storage_writer=storage_writer(storage, 0), no_dist=True)

    targets = {"large": torch.zeros(LARGE), "widened": torch.zeros(LARGE, dtype=torch.float64),
               "small": torch.zeros(10, 100), "step": -1}
    given = dict(targets)
    proxy = FaultyProxy(local_aws.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    reading = S3Storage("ckpt", "run")  # its client through the proxy too
    dcp.load(targets, checkpoint_id=checkpoint_id, storage_reader=storage_reader(reading), no_dist=True)
    proxy.close()

    stored = sum(item["Size"] for item in local_aws.client("s3").list_objects_v2(Bucket="ckpt")["Contents"])
    # each item's bytes once, give or take a read buffer (1 MiB) per item: with 16 MiB buffers the step, just before
    # "large" in its file, and "widened"'s headers fetched 84 MB for these 34
    assert proxy.served < stored + 4 * 2**20, (proxy.served, stored)
    # reads within what a stream fetched are served from it: 19 GETs here; io.BufferedReader, which fetched again
    # after each seek back into its buffer, made 48 (one per read of the archives' central directories)
    gets = [line for line, _ in proxy.requests if line.startswith("GET /ckpt/run/ckpt-000000001/")]
    assert len(gets) <= 24, gets

    assert all(targets[name] is given[name] for name in ("large", "widened", "small"))  # restored in place
    assert torch.equal(targets["large"], saved["large"])
    assert torch.equal(targets["widened"], saved["widened"].double())
    assert torch.equal(targets["small"], saved["small"])
    assert targets["step"] == 7


def test_a_large_tensors_ranged_get_answered_500_is_retried_and_the_restore_is_bitwise(local_aws, monkeypatch):
    """A large tensor is read in ranged GETs of READ_WINDOW, several at a time (S3Storage.read_into): the endpoint
    answers its second window with a 500, which is retried, and the tensor restores bitwise in place."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="ckpt")
    storage, checkpoint_id = S3Storage("ckpt", "run"), "s3://ckpt/run/ckpt-000000001"
    large = 3 * READ_WINDOW // 4 + 1024  # float32 elements: 3 windows and a bit
    saved = {"large": torch.rand(large, generator=torch.Generator().manual_seed(6))}
    dcp.save(saved, checkpoint_id=checkpoint_id, storage_writer=storage_writer(storage, 0), no_dist=True)
    (data,) = [item["Key"] for item in s3.list_objects_v2(Bucket="ckpt")["Contents"] if item["Size"] > READ_WINDOW]
    start = s3.get_object(Bucket="ckpt", Key=data)["Body"].read().find(saved["large"].numpy().tobytes())
    assert start > 0

    proxy = FaultyProxy(local_aws.port)
    second_window = f"bytes={start + READ_WINDOW}-{start + 2 * READ_WINDOW - 1}".encode()
    proxy.fail(second_window, status=500, code="InternalError")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    targets = {"large": torch.zeros(large)}
    given = targets["large"]
    reading = S3Storage("ckpt", "run")  # its client through the proxy too
    dcp.load(targets, checkpoint_id=checkpoint_id, storage_reader=storage_reader(reading), no_dist=True)
    proxy.close()

    assert proxy.failed_request is not None and second_window in proxy.failed_request
    windows = [request for request, _ in proxy.requests if request.startswith(f"GET /ckpt/{data}")]
    assert len(windows) >= 5, proxy.requests  # 4 windows and the retried one (and the archive's header reads)
    assert targets["large"] is given and torch.equal(given, saved["large"])


def test_a_read_at_the_end_of_a_file_returns_what_is_there_and_past_it_nothing(local_aws):
    """S3Storage.read_at, what DCP's reader streams are made of: a range past the end of a file is cut at its end
    (206), one starting past it is an empty read (416 InvalidRange), not an error."""
    boto3.client("s3").create_bucket(Bucket="ckpt")
    boto3.client("s3").put_object(Bucket="ckpt", Key="run/ckpt-000000001/__0_0.distcp", Body=b"0123456789")
    storage, into = S3Storage("ckpt", "run"), bytearray(8)
    assert storage.read_at("ckpt-000000001", "__0_0.distcp", 6, memoryview(into)) == 4 and into[:4] == b"6789"
    assert storage.read_at("ckpt-000000001", "__0_0.distcp", 10, memoryview(into)) == 0
    assert storage.read_at("ckpt-000000001", "__0_0.distcp", 0, memoryview(into)) == 8 and into == b"01234567"
