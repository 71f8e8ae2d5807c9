# JupyterHub with DockerSpawner, one GPU per user through gpupin: every user's server is
# a container started with `--runtime gpupin`, asking for one GPU and naming its user, so
# that each user gets a GPU of their own and gpupin's [limits] apply to them.
#
# The gpupin side (/etc/gpupin/config.toml on the Docker host), see docs/jupyterhub.md:
#
#     trusted_user_label = "gpupin.user"   # the label below names the container's user
#     [limits]
#     max_gpus_per_user = 1                # a user's second server is refused
#
# and `gpupin install docker` (registers the `gpupin` runtime with dockerd). Only turn
# trusted_user_label on where users cannot start containers themselves: anyone who can
# may write any label.
#
# This file is the part of a jupyterhub_config.py that gpupin needs; merge it into yours
# (or `load_subconfig("/path/to/this/file")` from it). tests/jupyterhub_e2e.rs loads it
# as it is and runs it against a real Hub.

c = get_config()  # noqa: F821 (JupyterHub's config loader provides get_config)

c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"

# Your single-user image (anything that runs jupyterhub-singleuser). Do NOT add
# `--gpus` / device_requests or NVIDIA_VISIBLE_DEVICES here: gpupin chooses the GPU.
# c.DockerSpawner.image = "quay.io/jupyter/base-notebook:latest"

# Every server runs under gpupin's runtime: it takes a GPU from the ledger when the
# container is created and gives it back when the container is removed.
c.DockerSpawner.extra_host_config = {"runtime": "gpupin"}

# The request: one GPU, for this Hub user. DockerSpawner fills in the templates per
# server. {raw_username} is the Hub's user name as it is; {username} would be escaped
# for Docker names (`alice.smith` -> `alice-2esmith`), which no /etc/passwd has.
# gpupin refuses a label naming no user of the host (Hub users must be host users with
# the same names: PAM, LDAP synced into /etc/passwd, or created by the admin).
c.DockerSpawner.extra_create_kwargs = {
    "labels": {
        "gpupin.count": "1",
        "gpupin.user": "{raw_username}",
    }
}

# Remove the container when the server stops. Its GPU is free as soon as it stops
# either way: gpupin releases when a container stops, and allocates again if a kept
# container is started again.
c.DockerSpawner.remove = True

# Users may start named servers; each one asks for its own GPU, so with
# max_gpus_per_user = 1 a user's second server is refused by gpupin, and the Hub shows
# the refusal ("Spawn failed: ... alice holds 1 GPU and alice asks for 1 more; their
# limit is 1 (limits.max_gpus_per_user)").
c.JupyterHub.allow_named_servers = True
