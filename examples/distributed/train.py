#!/usr/bin/env python3
"""A PyTorch DistributedDataParallel rank, the gpupin way: run it as

    gpupin exec --count 4 -- python3 launch.py -- python3 train.py
    # or, with PyTorch's own launcher:
    gpupin exec --count 4 -- torchrun --nproc-per-node=4 train.py

The GPUs are gpupin's to choose: nothing here names a physical GPU. Each rank takes
cuda:LOCAL_RANK, the LOCAL_RANK-th of the GPUs gpupin pinned in CUDA_VISIBLE_DEVICES.
(Not run in CI: a PyTorch wheel is too heavy; tests/python_client.rs runs launch.py with
stub_rank.py, which picks its device the same way.)
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
model = DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100):
    optimizer.zero_grad()
    loss = model(torch.randn(64, 1024, device="cuda")).square().mean()
    loss.backward()
    optimizer.step()
if dist.get_rank() == 0:
    print("trained on", dist.get_world_size(), "GPUs:", os.environ["CUDA_VISIBLE_DEVICES"])
dist.destroy_process_group()
