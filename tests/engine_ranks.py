"""One rank of the engine tests, run under torchrun (real processes, gloo):

    engine_ranks.py save URI OUT --steps 2 --save-at 1 2 [--parallel ddp|fsdp]
    engine_ranks.py load URI OUT [--parallel ddp|fsdp]

``save`` trains an mlp (each rank on its own random batches) and saves a sharded checkpoint through the
ShardedCheckpointManager at the given steps; ``load`` builds the model from another seed and resumes. Each rank
writes OUT/rank<N>.json: the events, the resumed step and, per saved or loaded step, the sha256 of the whole model,
the whole optimizer state (gathered from every rank under FSDP), the progress and this rank's RNG.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from gpuyard.jobs.workload import dist
from gpuyard.jobs.workload.data import build_model
from gpuyard.jobs.workload.engine import ShardedCheckpointer
from gpuyard.jobs.workload.manager import SaveSchedule
from gpuyard.jobs.workload.sharded import ShardedCheckpointManager
from gpuyard.jobs.workload.state import RankRNG, TrainProgress
from gpuyard.jobs.workload.storage import open_storage


def digest(value) -> str:
    """sha256 of a nested state: tensors by dtype, shape and bytes, the rest by repr."""
    hasher = hashlib.sha256()

    def feed(item) -> None:
        if isinstance(item, torch.Tensor):
            item = item.detach().cpu().contiguous()
            hasher.update(f"{item.dtype}{tuple(item.shape)}".encode())
            hasher.update(item.view(torch.uint8).numpy().tobytes() if item.numel() else b"")
        elif isinstance(item, dict):
            for key in sorted(item, key=str):
                hasher.update(str(key).encode())
                feed(item[key])
        elif isinstance(item, (list, tuple)):
            for element in item:
                feed(element)
        else:
            hasher.update(repr(item).encode())
    feed(value)
    return hasher.hexdigest()


def state_digests(model, optimizer, progress: TrainProgress) -> dict[str, str]:
    full = StateDictOptions(full_state_dict=True)  # a collective under FSDP: every rank calls it at the same point
    return {"model": digest(get_model_state_dict(model, options=full)),
            "optimizer": digest(get_optimizer_state_dict(model, optimizer, options=full)),
            "progress": digest(progress.state_dict()),
            "rng": digest([torch.get_rng_state(), random.getstate()])}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["save", "load"])
    parser.add_argument("uri")
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--save-at", type=int, nargs="*", default=[])
    parser.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    args = parser.parse_args(argv)
    env = dist.launcher_env()
    dist.init_process_group(env)
    seed = 7 if args.mode == "save" else 1234  # a load must overwrite every weight to match
    model = build_model("mlp", seed)
    if args.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
        trained = model
    else:
        trained = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng, progress = RankRNG(seed, env.rank, torch.device("cpu")), TrainProgress()
    rng.reseed()
    events: list[dict] = []
    checkpointer = ShardedCheckpointer(open_storage(args.uri, user_agent=f"gpuyard-rank/{env.rank}"),
                                       {"model": "mlp"}, env.rank, emit=events.append)
    manager = ShardedCheckpointManager(checkpointer, SaveSchedule(1), env, reseed=rng.reseed,
                                       replicated=args.parallel == "ddp")
    for name, stateful in (("model", model), ("optimizer", optimizer), ("progress", progress)):
        manager.register(name, stateful)
    manager.register("rng", rng, per_rank=True)
    report: dict = {"rank": env.rank, "world_size": env.world_size, "states": {}}
    if args.mode == "save":
        for step in range(1, args.steps + 1):
            optimizer.zero_grad()
            source, targets = torch.rand(8, 20), torch.rand(8, 1)
            F.mse_loss(trained(source), targets).backward()
            optimizer.step()
            progress.advance(8 * env.world_size)
            if step in args.save_at:
                report["states"][step] = state_digests(model, optimizer, progress)
                manager.save(step, None)
                report.setdefault("blocked_seconds", []).append(manager.last_blocked_seconds)
                manager.wait()
    else:
        resumed = manager.load()
        report["resumed"] = resumed and {"step": resumed.step, "world_size": resumed.world_size}
        report["states"][progress.global_step] = state_digests(model, optimizer, progress)
    report["events"] = events
    (args.out / f"rank{env.rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    # not the interpreter's exit: the DDP reducer's teardown there can deadlock with gloo's worker thread
    # (seen in CI: ~ProcessGroupGloo waiting on a thread that waits for the GIL), as jobs/workload/dist.py says
    dist.leave(0)


if __name__ == "__main__":
    main(sys.argv[1:])
