//! Tables and JSON for `gpupin inventory` and `gpupin status`, rendered to strings.
