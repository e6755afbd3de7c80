"""torchrun: the processes' start, the first process first, sums over them, leaving together; with one, the identity."""
import os
import sys

import torch
import torch.distributed as dist

from common.device import pick_device
from common.errors import UserError


def start(device_name):
    """(rank, world size, device). Under torchrun (WORLD_SIZE > 1): gloo on the CPU, nccl on GPUs."""
    device = pick_device(device_name)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    if device.type == "mps":
        raise UserError("torchrun with --device mps: torch.distributed does not support Apple's backend; "
                        "use --device cpu, or one process")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), world, device


def first_process_first(run, load):
    """load() on process 0 first (it downloads), then on the others; an error there stops every process."""
    result, problem = None, None
    if run.rank == 0:
        try:
            result = load()
        except UserError as error:
            problem = str(error)
    if run.world > 1:
        message = [problem]
        dist.broadcast_object_list(message, src=0)
        problem = message[0]
    if problem:
        raise UserError(problem)
    return result if run.rank == 0 else load()


def sum_over_processes(values, run):
    """The sum over every process of a number, or of each of a tuple of numbers: one all_reduce."""
    many = isinstance(values, tuple)
    if run.world == 1:
        return tuple(map(float, values)) if many else float(values)
    total = torch.tensor(values if many else [values], dtype=torch.float64, device=run.device)
    dist.all_reduce(total)
    return tuple(total.tolist()) if many else total.item()


LEAVING = {"together": False}  # set once every process has finished its sections (finish_together)


def finish_together(world):
    """Every process waits here for the others; then each may leave at once (leave)."""
    if world > 1:
        dist.barrier()
        LEAVING["together"] = True


def leave(status):
    """sys.exit(status), torchrun's process group ended first; once every torchrun process has finished, os._exit: a
    finalizing interpreter can abort under a gloo thread (docs/performance.md, "Several processes")."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    if not LEAVING["together"]:
        sys.exit(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
