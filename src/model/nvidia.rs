//! NVIDIA's names, spelled once for every layer: the env vars its runtime and CUDA images
//! read, the CDI names its toolkit writes, and where the driver puts a GPU's node.

/// The env var NVIDIA's runtime and hook read a container's GPUs from.
pub(crate) const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Set by CUDA images; alone (without NVIDIA_REQUIRE_CUDA) it makes a "legacy" image that
/// NVIDIA's runtime gives every GPU.
pub(crate) const CUDA_VERSION: &str = "CUDA_VERSION";
/// Annotation prefix NVIDIA's runtime (`modes.cdi.annotation-prefixes`) and containerd's
/// CRI read CDI device names from.
pub(crate) const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// CDI kind of NVIDIA's GPUs, as `nvidia-ctk cdi generate` writes it, with its `=`.
pub(crate) const CDI_GPU_PREFIX: &str = "nvidia.com/gpu=";

/// The device node of the GPU with device minor `minor`, as the driver creates it.
pub(crate) fn gpu_node(minor: u32) -> String {
    format!("/dev/nvidia{minor}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_gpus_node_is_named_by_its_minor() {
        assert_eq!(super::gpu_node(0), "/dev/nvidia0");
        assert_eq!(super::gpu_node(17), "/dev/nvidia17");
    }
}
