"""DCP on S3 (torch 2.13.0): saves through the S3 Connector for PyTorch's DCP writer (s3torchconnector 1.5.0
``dcp/s3_file_system.py``), subclassed to fail when any upload failed and to hand it tensors in pieces; restores
through DCP's own ``FileSystemReader`` on boto3 ranged GETs, reading each large tensor's bytes straight into the
tensor it restores, as boto3's managed download reads an object (ranged GETs in parallel), holding no more than a
chunk per GET besides the tensors.
"""

from __future__ import annotations

import dataclasses
import io
import os
import queue
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager

import torch
from boto3.s3.transfer import TransferConfig
from s3torchconnector import S3ClientConfig
from s3torchconnector._s3client import S3Client
from s3torchconnector._user_agent import UserAgent
from s3torchconnector.dcp import S3FileSystem, S3StorageWriter
from torch.distributed._shard._utils import narrow_tensor_by_index  # as DCP's filesystem.py imports it
from torch.distributed.checkpoint.filesystem import FileSystemReader, _write_files_from_queue
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future  # what DCP waits on (torch 2.13.0 filesystem.py), not concurrent.futures'

from gpuyard.jobs.workload.storage import S3Storage

# Tensors larger than this are read into their targets; one of at most this size takes DCP's own path and is held
# twice at most (torch.load's copy, then the copy into its target).
LARGE_TENSOR = 16 * 2**20
# Every read of DCP's own path goes through a stream of ranged GETs buffering this much: a small read (the step, RNG
# state, a small tensor's archive headers) fetches this much from where it starts, so that the items after it come
# from the buffer; a read at least this big is one ranged GET of its bytes. A small item just before a large tensor
# (the step: DCP writes bytes items first) fetches this much of that tensor, which is read again into its target:
# with 16 MiB, tests/test_workload_s3_dcp.py's restore fetched 84 MB for a checkpoint of 34 (1 MiB: 37).
READ_BUFFER = 2**20
# A large tensor's archive headers (torch.save's zip: data.pkl first, the central directory last) are read through
# a buffer this small, so reading them does not fetch the tensor's bytes.
HEADER_BUFFER = 64 * 2**10
# A large tensor's bytes are read into it by ranged GETs of READ_WINDOW bytes, READ_STREAMS at a time: boto3's
# managed download's part size and concurrency (boto3.s3.transfer.TransferConfig defaults), each GET's body copied
# into the tensor as it comes (S3Storage.read_into). Was: the connector's client, one window at a time, which it
# buffers ahead without limit (s3torchconnector 1.5.0's S3ClientConfig has no read window or backpressure
# setting): bench_checkpoint 1 GB restore 0.56-0.60 of boto3 on s3s-fs with 32 MiB windows; several at a time
# came near 0.8 but held 1.30-1.48x the shard.
_TRANSFER = TransferConfig()
READ_WINDOW, READ_STREAMS = _TRANSFER.multipart_chunksize, _TRANSFER.max_request_concurrency


def s3_client(rank: int) -> tuple[str, S3Client]:
    """The S3 Connector's client, at ``AWS_ENDPOINT_URL`` when set (path-style, as a local endpoint needs), naming
    the rank in its User-Agent. s3torchconnector 1.5.0 ``dcp/s3_file_system.py``: ``S3FileSystem`` takes an
    ``s3_client``; its DCP writer and reader build one without an endpoint, so ours replace their ``fs``."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    config = S3ClientConfig(force_path_style=endpoint is not None, max_attempts=6)
    return region, S3Client(region, endpoint=endpoint, user_agent=UserAgent([f"gpuyard-rank/{rank}"]),
                            s3client_config=config)


# What the connector's writer is given at a time (see _Pieces).
WRITE_PIECE = 8 * 2**20


class _Pieces(io.RawIOBase):
    """An ``S3Writer`` (s3torchconnector 1.5.0 s3writer.py) given each write in pieces of WRITE_PIECE bytes at most.
    It copies a memoryview, what torch.save writes a tensor's bytes as, with ``tobytes()`` (its client takes only
    bytes) before its client copies it again; a copy of a whole 64 MiB tensor is a new mapping, whose pages the kernel
    faults in and zeroes every time: 512 MiB cost 0.38 s of CPU in 64 MiB copies here, 0.04 s in 8 MiB ones, which
    malloc reuses."""

    def __init__(self, writer):
        super().__init__()
        self.writer = writer

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        for at in range(0, len(view), WRITE_PIECE):
            self.writer.write(bytes(view[at:at + WRITE_PIECE]))
        return len(view)

    def tell(self) -> int:
        return self.writer.tell()


class S3ShardWriter(S3StorageWriter):
    """``S3StorageWriter`` whose ``write_data`` raises if any of its files failed to upload, each file's writes
    given to the connector in pieces (``_Pieces``).

    DCP writes ``thread_count`` files, all but one on threads whose exceptions it drops: such a thread dies, its
    files' results are missing and the save returns as if done (torch 2.13.0 torch/distributed/checkpoint/
    filesystem.py: ``_write_files_from_queue`` catches only ``queue.Empty``, ``_FileSystemWriter._write_data`` joins
    its threads and returns what the result queue holds). Here every file is written by the same pool of
    ``thread_count`` threads running DCP's ``_write_files_from_queue``, and the first failure is raised: no file's
    fate depends on which thread took it.
    """

    def __init__(self, region: str, path: str, client: S3Client, thread_count: int, **kwargs):
        super().__init__(region, path, thread_count=thread_count, **kwargs)
        self.fs = S3FileSystem(region, s3_client=client)

    def _write_data(self, planner, file_queue: queue.Queue) -> Future:
        results: queue.Queue = queue.Queue()
        writing = (self._create_stream, file_queue, results, planner, self.transforms, self.per_thread_copy_ahead,
                   self.sync_files, self.thread_count, self.serialization_format)
        with ThreadPoolExecutor(self.thread_count, thread_name_prefix="dcp-upload") as pool:
            threads = [pool.submit(_write_files_from_queue, *writing) for _ in range(self.thread_count)]
        for thread in threads:
            thread.result()  # the first thread's failure, if any
        written = []
        while not results.empty():
            written += results.get_nowait()
        done: Future = Future()
        done.set_result(written)
        return done

    @contextmanager
    def _create_stream(self, path: str, mode: str) -> Iterator[_Pieces]:
        with self.fs.create_stream(path, mode) as writer:
            yield _Pieces(writer)


class _ObjectReader(io.RawIOBase):
    """One file of a sharded checkpoint as a seekable stream of ranged GETs (S3Storage.read_at). A read shorter than
    ``buffer`` fetches ``buffer`` bytes from where it starts, and later reads within them are served from there (as
    s3torchconnector 1.5.0's ``s3reader/ranged.py`` buffers); a longer one is one GET of its bytes. Not
    ``io.BufferedReader``: it fetched again after a seek back into what it had read (CPython 3.11), so a torch.load of
    an archive's headers made a GET for each of them."""

    def __init__(self, storage: S3Storage, folder: str, name: str, buffer: int):
        super().__init__()
        self.storage, self.folder, self.name, self.buffer = storage, folder, name, buffer
        self.position, self._start, self._block = 0, 0, memoryview(b"")
        self._size: int | None = None  # known once a GET came back short

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:  # DCP's file views turn theirs into absolute seeks (torch 2.13.0 checkpoint/utils.py)
            raise io.UnsupportedOperation(f"{self.folder}/{self.name}: seek from the end")
        self.position = offset if whence == io.SEEK_SET else self.position + offset
        return self.position

    def readinto(self, into) -> int:
        into, done = memoryview(into).cast("B"), 0
        while done < len(into) and (self._size is None or self.position < self._size):
            wanted, buffered = len(into) - done, self.position - self._start
            if 0 <= buffered < len(self._block):
                count = min(wanted, len(self._block) - buffered)
                into[done:done + count] = self._block[buffered:buffered + count]
            elif wanted >= self.buffer:
                count = self._get(self.position, into[done:])
            else:
                block = memoryview(bytearray(self.buffer))
                self._start, self._block = self.position, block[:self._get(self.position, block)]
                continue
            done, self.position = done + count, self.position + count
        return done

    def _get(self, start: int, into: memoryview) -> int:
        count = self.storage.read_at(self.folder, self.name, start, into)
        if count < len(into):
            self._size = start + count
        return count


class S3Files:
    """What DCP's ``FileSystemReader`` reads a checkpoint's files through (its ``init_path``, ``concat_path`` and
    ``create_stream``; torch 2.13.0 torch/distributed/checkpoint/filesystem.py ``FileSystemBase``), on ``storage``'s
    boto3 client: each file a stream of ranged GETs of ``buffer`` bytes at least."""

    def __init__(self, storage: S3Storage, buffer: int):
        self.storage, self.buffer = storage, buffer

    def init_path(self, path: str | os.PathLike) -> str:
        return str(path)

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return f"{path}/{suffix}"

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.RawIOBase]:
        if mode != "rb":
            raise ValueError(f"{path}: S3Files only reads (mode {mode!r})")
        folder, _, name = str(path).removeprefix(f"{self.storage.uri}/").rpartition("/")
        with _ObjectReader(self.storage, folder, name, self.buffer) as stream:
            yield stream


class S3ShardReader(FileSystemReader):
    """DCP's ``FileSystemReader`` on S3 (``S3Files``), reading each large tensor's bytes into the tensor DCP restores
    it to, every request through ``storage``'s boto3 client.

    DCP's read path (torch 2.13.0 torch/distributed/checkpoint/filesystem.py, ``FileSystemReader.read_data``)
    ``torch.load``s each item into a new tensor, then copies it into ``planner.resolve_tensor``'s target. Here a
    tensor item larger than LARGE_TENSOR is located in its torch.save archive by loading it on the meta device, which
    reads only the headers and gives the storage's offset in the archive (``untyped_storage()._checkpoint_offset``,
    as torch 2.13.0's own ``torch/distributed/checkpoint/_experimental/checkpoint_reader.py`` ``_partial_read``
    does), then its bytes are read into its target in windows of READ_WINDOW: locating and reading share one pool of
    READ_STREAMS threads, so one tensor's headers are read while others' bytes come. Items that cannot be copied as
    bytes (a target on a GPU, another dtype, a non-contiguous slice, stream transforms) and the rest take DCP's own
    path, in offset order, through a READ_BUFFER buffer. The bytes are taken as written: a checkpoint saved on a
    big-endian host would need torch.load's byte swap.
    Was: s3torchconnector 1.5.0's ``S3StorageReader``, whose client (the CRT's) took 40-75 ms a small request here
    against boto3's 4-7 (``.metadata``, the small items, each large tensor's headers): a 64 MB restore spent about
    0.4 s more than boto3's download of the same bytes, most of it there.
    """

    def __init__(self, path: str, storage: S3Storage):
        super().__init__(path)
        self.fs = S3Files(storage, READ_BUFFER)
        self.path = self.fs.init_path(path)
        self._headers_fs = S3Files(storage, HEADER_BUFFER)
        self.storage = storage

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Items in the order of their offsets, so that each file is read front to back (as s3torchconnector
        1.5.0's ``S3StorageReader.prepare_local_plan`` orders them)."""
        return dataclasses.replace(
            plan, items=sorted(plan.items, key=lambda item: self.storage_data[item.storage_index].offset))

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        large = [item for item in plan.items if self._large(item)]
        folder = self.path.removeprefix(self.storage.uri).strip("/")
        read, reads = [], []
        with ThreadPoolExecutor(READ_STREAMS, thread_name_prefix="dcp-read") as pool:
            try:
                locating = {pool.submit(self._locate, item, planner): item for item in large}
                for located in as_completed(locating):
                    if (found := located.result()) is None:
                        continue
                    target, relative_path, start = found
                    read.append((locating[located], target))
                    into = memoryview(target.reshape(-1).view(torch.uint8).numpy())
                    reads += [pool.submit(self.storage.read_into, folder, relative_path, start + at,
                                          into[at:at + READ_WINDOW]) for at in range(0, len(into), READ_WINDOW)]
                for window in reads:
                    window.result()
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
        for item, target in read:
            planner.commit_tensor(item, target)
        done = {id(item) for item, _ in read}
        rest = [item for item in plan.items if id(item) not in done]  # in offset order, as DCP's reader wants them
        return super().read_data(dataclasses.replace(plan, items=rest), planner)

    def _large(self, item: ReadItem) -> bool:
        stored = self.storage_data[item.storage_index]
        return item.type == LoadItemType.TENSOR and stored.length > LARGE_TENSOR and not stored.transform_descriptors

    def _locate(self, item: ReadItem, planner: LoadPlanner) -> tuple[torch.Tensor, str, int] | None:
        """``item``'s target, its file and the offset of its bytes there, read from its archive's headers through
        a stream of its own; None if they cannot go as bytes."""
        target = planner.resolve_tensor(item).detach()
        if target.device.type != "cpu" or not target.is_contiguous():
            return None
        stored = self.storage_data[item.storage_index]
        with self._headers_fs.create_stream(self.fs.concat_path(self.path, stored.relative_path), "rb") as stream:
            saved = torch.load(self._slice_file(stream, stored), map_location="meta", weights_only=True)
        source = narrow_tensor_by_index(saved, item.storage_offsets, item.lengths)
        offset = saved.untyped_storage()._checkpoint_offset
        as_bytes = (offset is not None and source.dtype == target.dtype and source.size() == target.size()
                    and source.is_contiguous())
        if not as_bytes:
            return None
        return target, stored.relative_path, stored.offset + offset + source.storage_offset() * source.element_size()
