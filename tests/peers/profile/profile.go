// Package profile builds the machines the mock NVML serves, from NVIDIA's own mock
// servers in github.com/NVIDIA/go-nvml/pkg/nvml/mock: their GPUs, names, memory, bus ids,
// minors and driver versions are NVIDIA's; nothing about a GPU is made up here.
//
// The one change: NVIDIA's mock draws each GPU's UUID from crypto/rand when the server is
// built, so every process that loads the library would see other UUIDs. A real driver's
// UUIDs are fixed, and gpupin keys its ledger and caches by them, so the UUIDs are drawn
// (by the mock's own uuid.New) from a generator seeded with the profile's name.
package profile

import (
	"fmt"
	"hash/fnv"
	"math/rand"
	"sort"
	"sync"

	"github.com/google/uuid"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Env names the profile a process's library serves.
const Env = "GPUPIN_MOCK_NVML_PROFILE"

// Default is served when Env is unset.
const Default = "dgxa100"

var builders = map[string]func() *server.Server{
	// DGX A100: 8x A100-SXM4-40GB (dgxa100.New).
	"dgxa100": dgxa100.New,
	// DGX H100: 8x H100-SXM5-80GB (dgxh100.New).
	"dgxh100": dgxh100.New,
	// A PCIe machine: 8x NVIDIA's A30 PCIe configuration, in NVIDIA's server (the
	// constructor the dgxa100 package offers for other GPU mixes).
	"a30pcie": func() *server.Server {
		return dgxa100.NewWithGPUs(gpus.Multiple(8, gpus.A30_PCIE_24GB)...)
	},
	// DGX A100 80GB: 8x NVIDIA's A100-SXM4-80GB configuration, the GPU MIG is mostly
	// cut on (profiles 1g.10gb ... 7g.80gb), in NVIDIA's DGX A100 server.
	"dgxa100-80gb": func() *server.Server {
		return dgxa100.NewWithGPUs(gpus.Multiple(8, gpus.A100_SXM4_80GB)...)
	},
}

var mu sync.Mutex

// Names lists the profiles.
func Names() []string {
	names := make([]string, 0, len(builders))
	for name := range builders {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// New builds the profile `name`, with the UUIDs every process gets for it.
func New(name string) (*server.Server, error) {
	build, ok := builders[name]
	if !ok {
		return nil, fmt.Errorf("unknown mock NVML profile %q: expected one of %v", name, Names())
	}
	mu.Lock()
	defer mu.Unlock()
	seed := fnv.New64a()
	seed.Write([]byte(name))
	uuid.SetRand(rand.New(rand.NewSource(int64(seed.Sum64()))))
	defer uuid.SetRand(nil)
	return build(), nil
}
