#!/usr/bin/env python3
"""A rank without a framework: prints which device it would use, as train.py picks it."""

import os

local_rank = int(os.environ["LOCAL_RANK"])
visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
line = "rank {} of {}: LOCAL_RANK={} CUDA_VISIBLE_DEVICES={} device cuda:{} = GPU {}\n".format(
    os.environ["RANK"],
    os.environ["WORLD_SIZE"],
    local_rank,
    os.environ["CUDA_VISIBLE_DEVICES"],
    local_rank,
    visible[local_rank],
)
# One write: the ranks share the job's stdout, and a line written in pieces could be
# cut by another rank's.
os.write(1, line.encode())
