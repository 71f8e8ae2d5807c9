#!/usr/bin/env python3
"""One rank per GPU that gpupin pinned: what `torchrun --nproc-per-node=N` does, in the
standard library, for a job run as

    gpupin exec --count 4 -- python3 launch.py -- python3 train.py [ARGS]

gpupin exec sets CUDA_VISIBLE_DEVICES to the job's GPUs (indices in PCI bus order, with
CUDA_DEVICE_ORDER=PCI_BUS_ID) and confines the job to them. Inside, CUDA numbers those
GPUs 0..N-1 in that same order, so rank LOCAL_RANK uses cuda:LOCAL_RANK, which is the
LOCAL_RANK-th GPU in CUDA_VISIBLE_DEVICES. Every rank keeps the whole list: NCCL's
peer-to-peer paths between the GPUs need each rank to see them all.

Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, as torch.distributed's env:// init reads them. The launcher ends with the
first failing rank's status (the others are stopped), or 0.
"""

import os
import signal
import socket
import subprocess
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        print("usage: launch.py -- COMMAND [ARGS]: one COMMAND per GPU in CUDA_VISIBLE_DEVICES", file=sys.stderr)
        return 2
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    gpus = [g for g in visible.split(",") if g]
    if not gpus:
        print("launch.py: CUDA_VISIBLE_DEVICES is empty: run it under gpupin exec --count N", file=sys.stderr)
        return 2
    port = os.environ.get("MASTER_PORT") or str(free_port())
    ranks = []
    for local_rank in range(len(gpus)):
        env = dict(os.environ)
        env.update(
            RANK=str(local_rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(len(gpus)),
            LOCAL_WORLD_SIZE=str(len(gpus)),
            MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            MASTER_PORT=port,
        )
        ranks.append(subprocess.Popen(argv, env=env))
    # gpupin exec passes TERM and the like on to this process: each rank gets them too.
    def forward(sig, _frame):
        for rank in ranks:
            if rank.poll() is None:
                rank.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    status = 0
    for rank in ranks:
        code = rank.wait()
        if code != 0 and status == 0:
            status = code if code > 0 else 128 - code
            forward(signal.SIGTERM, None)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
