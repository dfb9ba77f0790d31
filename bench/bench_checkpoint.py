"""Sharded checkpoints (jobs/workload/engine.py) against plain boto3, world size 2 on a local S3; prints JSON.

    python bench/bench_checkpoint.py [SIZE ...] [--server moto|s3s-fs]    # 64MB, 1GB, 4GB: every size by default

The endpoint is moto_server (Python, the tests' S3) or, with ``--server s3s-fs``, the s3s crate's S3 server on a
folder (Rust; ``cargo install s3s-fs@0.14.1 --features binary`` puts ``s3s-fs`` on PATH): both share the 2 cores with
the ranks, and what the server spends per request and per byte decides much of each ratio, so a second server says
which figures belong to the client.

For each total size (each rank holds half, as its own shard: what FSDP gives a rank), in one run:

- ``save_vs_boto3``: our save (DCP async_save through the ShardedCheckpointManager, every rank writing its part
  with s3torchconnector, rank 0 checking the files and publishing the manifest) against each rank uploading the
  same number of raw bytes with boto3's managed multipart upload (``upload_fileobj``, its defaults), both ranks
  at once; ratio of MB/s (above 1: ours is faster). Wall time from a barrier to the last rank done.
- ``restore_vs_boto3``: ``manager.load()`` (rank 0 chooses and checks the manifest, every rank reads its part into
  its tensors: each large tensor's bytes by boto3 ranged GETs, the rest through DCP's reader on boto3 too) against
  each rank's ``download_fileobj`` of its raw bytes, each in fresh processes.
- ``blocked_fraction``: the time ``save`` holds the training thread (staging: a copy to host memory) over the
  whole save's time.
- ``restore_rss_vs_shard``: a rank's peak RSS rise over the restore, from after its checkpoint manager (and S3
  client) exists and before its (untouched) tensors are allocated, as a multiple of its shard: 1.0 is one copy.

Saves run in ``SAVE_PAIRS`` pairs, boto3's then ours, and the ratio is the median pair's (with the lowest and highest
in ``save_vs_boto3_range``): on 2 shared cores one pair's ratio moved from 0.65 to 1.02 within one run (2026-12-05,
beside a simulated cluster), more than the gap measured. Restores run in ``RESTORE_PAIRS`` pairs too, ours and boto3's
download each in processes of its own, by turns first: the median pair's ratio with the range, the highest RSS.
(Before, 3 pairs, ours first, then boto3's in the same processes; before that, the best of 2 of ours against the best
of 4 of boto3's, which favoured boto3.) ``cpu_s`` says where
the cores went (both ranks' CPU seconds, the server's, the wall time) for the median pairs. Sizes that do not fit
this machine are reported as skipped with the reason.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import subprocess
import sys
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

BUCKET, RESTORE_PAIRS, SAVE_PAIRS, TENSOR_BYTES = "bench", 5, 5, 64 * 2**20
SERVER_PID = "BENCH_SERVER_PID"  # the moto_server whose CPU time each measurement reads
SIZES = {"64MB": 64 * 2**20, "1GB": 2**30, "4GB": 4 * 2**30}
# What a size needs here, each a multiple of it: memory for every rank's shard, its staging copy and the boto3
# baseline's raw bytes (3x, the 2 ranks together); disk for the server's files (moto keeps every object above about
# 5 MiB and every multipart part in a temporary file, moto 5.2.5 s3/models.py: SpooledTemporaryFile,
# MOTO_S3_DEFAULT_KEY_BUFFER_SIZE; s3s-fs writes the parts, then the whole object): the 3 checkpoints the manager
# keeps, the baseline's object, and its next upload's parts and whole object beside them (6x). Was 4x: a 4 GB run
# against s3s-fs with 25 GB free failed in its fourth pair (InternalError on an UploadPart: the disk was full).
MEMORY_TIMES, DISK_TIMES, SPARE = 3, 6, 2 * 2**30


def unfit(size: int) -> str | None:
    """Why ``size`` does not fit this machine now (measured: available memory, free disk), or None."""
    with open("/proc/meminfo") as meminfo:
        available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    free = shutil.disk_usage(tempfile.gettempdir()).free
    needs = {"memory": (MEMORY_TIMES * size + SPARE, available), "disk": (DISK_TIMES * size + SPARE, free)}
    short = [f"{what} {need / 2**30:.0f} GiB, {have / 2**30:.1f} GiB available" for what, (need, have) in needs.items()
             if have < need]
    return f"not run: needs {'; '.join(short)}" if short else None


class Shard:
    """This rank's tensors as a Stateful (its own keys: nothing is replicated)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, tensor in state.items():
            if tensor is not self.tensors[name]:
                self.tensors[name].copy_(tensor)


def shard_shapes(total: int, rank: int, world: int) -> dict[str, int]:
    """Element counts of this rank's float32 tensors: TENSOR_BYTES each, the last one the rest."""
    remaining, shapes, index = total // world // 4, {}, 0
    while remaining:
        count = min(remaining, TENSOR_BYTES // 4)
        shapes[f"rank{rank}.w{index}"] = count
        remaining, index = remaining - count, index + 1
    return shapes


def filled(shapes: dict[str, int], rank: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    return {name: torch.rand(count, generator=generator) for name, count in shapes.items()}


def _manager(label: str, env):
    from gpuyard.jobs.workload.engine import ShardedCheckpointer
    from gpuyard.jobs.workload.manager import SaveSchedule
    from gpuyard.jobs.workload.sharded import ShardedCheckpointManager
    from gpuyard.jobs.workload.storage import S3Storage

    checkpointer = ShardedCheckpointer(S3Storage(BUCKET, label), {"bench": label}, env.rank,
                                       emit=lambda event: sys.stderr.write(json.dumps(event) + "\n"))
    return ShardedCheckpointManager(checkpointer, SaveSchedule(1), env, replicated=False)


def median_index(ratios: list[float]) -> int:
    """The index of the median pair's ratio (the upper one of an even count)."""
    return sorted(range(len(ratios)), key=lambda index: ratios[index])[len(ratios) // 2]


@dataclass(frozen=True)
class Timed:
    """One timed call: seconds from a barrier to the last rank done, CPU seconds of both ranks and of the S3 server."""

    wall_s: float
    ranks_cpu_s: float
    server_cpu_s: float


def _cpu_seconds(pid: int | None = None) -> float:
    """User and system CPU seconds of this process (every thread), or of the process ``pid``."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # proc(5): utime, stime are 14, 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(call) -> Timed:
    server = int(os.environ[SERVER_PID])
    torch.distributed.barrier()
    started, cpu, served = time.perf_counter(), _cpu_seconds(), _cpu_seconds(server)
    call()
    spent = torch.tensor([time.perf_counter() - started, _cpu_seconds() - cpu], dtype=torch.float64)
    torch.distributed.all_reduce(spent[:1], op=torch.distributed.ReduceOp.MAX)  # every rank done past here
    torch.distributed.all_reduce(spent[1:], op=torch.distributed.ReduceOp.SUM)
    return Timed(spent[0].item(), spent[1].item(), _cpu_seconds(server) - served)


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(mode: str, label: str) -> None:
    """One rank under torchrun: ``save`` the shard of ``label`` (and boto3's upload of its bytes), ``restore`` it, or
    ``download`` boto3's copy of its bytes; rank 0 prints one JSON line."""
    import boto3

    from gpuyard.jobs.workload import dist

    env = dist.launcher_env()
    dist.init_process_group(env)
    s3, total = boto3.client("s3"), SIZES[label]
    shapes = shard_shapes(total, env.rank, env.world_size)
    shard_bytes = sum(shapes.values()) * 4
    result: dict[str, float] = {}
    if mode == "save":
        shard = Shard(filled(shapes, env.rank))
        payload = b"".join(tensor.numpy().tobytes() for tensor in shard.tensors.values())
        manager = _manager(label, env)
        manager.register("shard", shard)
        plain, ours, blocked = [], [], []
        for repeat in range(1, SAVE_PAIRS + 1):
            plain.append(_timed(lambda: s3.upload_fileobj(io.BytesIO(payload), BUCKET, f"plain-{label}-{env.rank}")))

            def save() -> None:
                manager.save(repeat, None)
                blocked.append(manager.last_blocked_seconds)
                manager.wait()
            ours.append(_timed(save))
        if env.is_main and manager.durable_step != SAVE_PAIRS:
            raise SystemExit(f"bench: the save of {label} was not published")
        ratios = [theirs.wall_s / mine.wall_s for theirs, mine in zip(plain, ours)]
        median = median_index(ratios)
        result = {"save": ours[median], "boto3_save": plain[median], "blocked_s": blocked[median],
                  "save_ratios": ratios}
    elif mode == "restore":
        manager = _manager(label, env)  # as a trainer does at its start: the S3 client and its buffers exist before
        baseline = _rss_bytes()
        shard = Shard({name: torch.empty(count) for name, count in shapes.items()})
        manager.register("shard", shard)
        restored = _timed(manager.load)
        rise = _rss_bytes() - baseline
        expected = filled(shapes, env.rank)
        if not all(torch.equal(shard.tensors[name], expected[name]) for name in shapes):
            raise SystemExit(f"bench: rank {env.rank} restored other values")
        rises = [None] * env.world_size
        torch.distributed.all_gather_object(rises, rise / shard_bytes)
        result = {"restore": restored, "restore_rss_vs_shard_per_rank": rises}
    else:
        result = {"boto3_restore": _timed(lambda: s3.download_fileobj(BUCKET, f"plain-{label}-{env.rank}",
                                                                      io.BytesIO()))}
    if env.is_main:
        sys.stdout.write(json.dumps(result, default=vars) + "\n")
    dist.destroy_process_group()
    dist.leave(0)  # not the interpreter's exit, which can deadlock in gloo's teardown


def _run(mode: str, label: str, env: dict[str, str]) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
               "--worker", mode, label]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        with tempfile.NamedTemporaryFile("w", prefix=f"bench-checkpoint-{mode}-{label}-", suffix=".log",
                                         delete=False) as log:
            log.write(done.stderr)
        events = [line for line in done.stderr.splitlines() if line.startswith('{"event"')]
        raise SystemExit(f"bench: {mode} {label} failed (the ranks' stderr: {log.name}):\n" + "\n".join(events[-20:]))
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(label: str, env: dict[str, str]) -> dict:
    saved, restores = _run("save", label, env), []
    for pair in range(RESTORE_PAIRS):  # ours and boto3's download each in a fresh process, by turns first
        order = ("restore", "download") if pair % 2 == 0 else ("download", "restore")
        restores.append({key: value for mode in order for key, value in _run(mode, label, env).items()})
    mb = SIZES[label] / 2**20
    save, boto3_save = saved["save"], saved["boto3_save"]
    restore_ratios = [r["boto3_restore"]["wall_s"] / r["restore"]["wall_s"] for r in restores]
    median = restores[median_index(restore_ratios)]
    restore, boto3_restore = median["restore"], median["boto3_restore"]
    rss = [max(per_rank) for per_rank in zip(*(r["restore_rss_vs_shard_per_rank"] for r in restores))]
    return {
        "save_vs_boto3": round(boto3_save["wall_s"] / save["wall_s"], 3),
        "save_vs_boto3_range": [round(min(saved["save_ratios"]), 3), round(max(saved["save_ratios"]), 3)],
        "restore_vs_boto3": round(boto3_restore["wall_s"] / restore["wall_s"], 3),
        "restore_vs_boto3_range": [round(min(restore_ratios), 3), round(max(restore_ratios), 3)],
        "blocked_fraction": round(saved["blocked_s"] / save["wall_s"], 4),
        "restore_rss_vs_shard": round(max(rss), 3),
        "save_MBps": round(mb / save["wall_s"], 1), "boto3_save_MBps": round(mb / boto3_save["wall_s"], 1),
        "restore_MBps": round(mb / restore["wall_s"], 1),
        "boto3_restore_MBps": round(mb / boto3_restore["wall_s"], 1),
        "blocked_s": round(saved["blocked_s"], 4),
        "restore_rss_vs_shard_per_rank": [round(r, 3) for r in rss],
        # where the 2 cores went: both ranks' CPU seconds and the S3 server's, ours and boto3's, per operation
        "cpu_s": {name: {"ranks": round(timed["ranks_cpu_s"], 2), "server": round(timed["server_cpu_s"], 2),
                         "wall": round(timed["wall_s"], 2)}
                  for name, timed in {"save": save, "boto3_save": boto3_save, "restore": restore,
                                      "boto3_restore": boto3_restore}.items()},
    }


class S3sFs:
    """s3s-fs on 127.0.0.1 over a temporary folder; ``env`` and ``pid`` as LocalAWS gives them."""

    def __enter__(self) -> "S3sFs":
        from gpuyard.jobs.local_aws import CREDENTIALS, HOST, free_port
        from gpuyard.jobs.processes import die_with_parent

        if not (binary := shutil.which("s3s-fs")):
            raise SystemExit("bench_checkpoint: s3s-fs not found: cargo install s3s-fs@0.14.1 --features binary")
        self.root, port = tempfile.mkdtemp(prefix="bench-s3s-fs-"), free_port()
        self.process = subprocess.Popen(
            [binary, "--host", HOST, "--port", str(port), "--access-key", CREDENTIALS["AWS_ACCESS_KEY_ID"],
             "--secret-key", CREDENTIALS["AWS_SECRET_ACCESS_KEY"], self.root],
            stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        self.pid, self.env = self.process.pid, {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://{HOST}:{port}"}
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise SystemExit(f"bench_checkpoint: s3s-fs did not answer on port {port}")
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        from gpuyard.jobs.processes import stop_tree

        stop_tree(self.process)
        shutil.rmtree(self.root, ignore_errors=True)


def main(argv: list[str]) -> None:
    import argparse

    from gpuyard.jobs.local_aws import LocalAWS

    parser = argparse.ArgumentParser(prog="bench_checkpoint")
    parser.add_argument("labels", nargs="*", metavar="SIZE")
    parser.add_argument("--server", choices=["moto", "s3s-fs"], default="moto")
    args = parser.parse_args(argv)
    labels = args.labels
    if unknown := set(labels) - set(SIZES):
        raise SystemExit(f"bench_checkpoint: no size {sorted(unknown)[0]!r}: {', '.join(SIZES)}")

    with LocalAWS() if args.server == "moto" else S3sFs() as aws:
        os.environ.update({**aws.env, SERVER_PID: str(aws.pid)})
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        report: dict = {label: {"skipped": reason} if (reason := unfit(size)) else measure(label, env)
                        for label, size in SIZES.items() if label in (labels or SIZES)}
    report["setup"] = {"world_size": 2, "launcher": "torchrun", "backend": "gloo", "endpoint": "moto_server" if args.server == "moto" else "s3s-fs 0.14.1",
                       "transport": "ours: s3torchconnector 1.5.0 (saves), boto3 ranged GETs (restores, large "
                                    "tensors' bytes straight into them); plain: boto3 upload_fileobj/download_fileobj",
                       "tensor_bytes": TENSOR_BYTES, "save_pairs": SAVE_PAIRS,
                       "restore_pairs": RESTORE_PAIRS,
                       "cpus": os.cpu_count()}
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(*sys.argv[2:4])
    else:
        main(sys.argv[1:])
