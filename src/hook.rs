//! `gpupin hook STAGE`.
