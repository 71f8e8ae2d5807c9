module gpupin/tests/peers/allocator

go 1.26.0

require github.com/NVIDIA/go-gpuallocator v0.5.0

require (
	github.com/NVIDIA/go-nvlib v0.5.0 // indirect
	github.com/NVIDIA/go-nvml v0.12.0-6 // indirect
	github.com/google/uuid v1.6.0 // indirect
)
