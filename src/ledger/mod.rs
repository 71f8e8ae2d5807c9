//! The lock directory: the only writer of gpupin's state.
