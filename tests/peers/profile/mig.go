package profile

// MIG geometry for the mock: the GPU and compute instances are created through NVIDIA's
// mock server itself (its Device.SetMigMode, CreateGpuInstance and the GPU instance's
// CreateComputeInstance, with the GPU's own MIG profile tables), so the GI and CI ids are
// the mock's. What go-nvml's mock server does not model is the MIG *device* (the handle
// NVML gives for each compute instance, with its own UUID, name and memory): MigDevice
// below is that, derived from the mock's instances and profile tables only.

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// MigEnv names the geometry: `GPU:PROFILE,PROFILE...` per GPU in MIG mode, GPUs
// separated by `;`, e.g. `0:3g.40gb,2g.20gb,1g.10gb,1g.10gb;7:` (GPU 7 in MIG mode with
// no instances). Unset or empty: no GPU in MIG mode.
const MigEnv = "GPUPIN_MOCK_MIG"

// MigDevice is one MIG device (a compute instance of a GPU instance) of a GPU.
type MigDevice struct {
	Parent   *server.Device
	Index    int // the MIG device index under its parent, in creation order
	GI       *server.GpuInstance
	CI       *server.ComputeInstance
	GiID     uint32
	CiID     uint32
	Profile  string // as nvidia-smi names it: 1g.10gb
	UUID     string // MIG-<uuid>
	Name     string // "<parent name> MIG <profile>", as a driver names MIG devices
	MemoryMB uint64
	// The GPU and compute instance profiles it was created with (the mock's tables).
	GiProfile nvml.GpuInstanceProfileInfo
	CiProfile nvml.ComputeInstanceProfileInfo
}

// giProfileName is the name NVIDIA gives a GPU instance profile: `<slices>g.<memory>gb`,
// the memory as the fraction of the GPU's, rounded up to eighths, times the GPU's memory
// in whole GB (how nvidia-smi's names come out: 9856 MB of an 80 GB A100 is `10gb`,
// 80384 MB is `80gb`), with `+me` for the profile with media extensions.
func giProfileName(id int, info nvml.GpuInstanceProfileInfo, totalMB uint64) string {
	fraction := float64(info.MemorySizeMB) / float64(totalMB)
	fraction = math.Ceil(fraction*8) / 8
	totalGB := float64((totalMB + 1023) / 1024)
	name := fmt.Sprintf("%dg.%dgb", info.SliceCount, uint64(math.Round(fraction*totalGB)))
	if id == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 {
		name += "+me"
	}
	return name
}

// giProfile finds the GPU instance profile `name` among the GPU's, lowest id first.
func giProfile(d *server.Device, name string) (nvml.GpuInstanceProfileInfo, error) {
	ids := make([]int, 0, len(d.Config.MIGProfiles.GpuInstanceProfiles))
	for id := range d.Config.MIGProfiles.GpuInstanceProfiles {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	var names []string
	for _, id := range ids {
		info := d.Config.MIGProfiles.GpuInstanceProfiles[id]
		n := giProfileName(id, info, d.Config.MemoryMB)
		if n == name {
			return info, nil
		}
		names = append(names, n)
	}
	return nvml.GpuInstanceProfileInfo{}, fmt.Errorf("GPU %d (%s) has no MIG profile %q: expected one of %v", d.Index, d.Config.Name, name, names)
}

// ParseMig reads a geometry (MigEnv's format) into GPU index -> profiles.
func ParseMig(spec string) (map[int][]string, error) {
	out := map[int][]string{}
	for _, part := range strings.Split(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		gpu, list, ok := strings.Cut(part, ":")
		index, err := strconv.Atoi(strings.TrimSpace(gpu))
		if !ok || err != nil || index < 0 {
			return nil, fmt.Errorf("%s %q: expected GPU:PROFILE,PROFILE... per GPU, separated by ;", MigEnv, part)
		}
		if _, seen := out[index]; seen {
			return nil, fmt.Errorf("%s: GPU %d twice", MigEnv, index)
		}
		out[index] = []string{}
		for _, p := range strings.Split(list, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out[index] = append(out[index], p)
			}
		}
	}
	return out, nil
}

// ApplyMig puts the GPUs `spec` names into MIG mode and creates their instances through
// the mock, one GPU instance with one compute instance of its full size per profile, in
// order. Returns the MIG devices per GPU index.
func ApplyMig(s *server.Server, spec string) (map[int][]*MigDevice, error) {
	geometry, err := ParseMig(spec)
	if err != nil {
		return nil, err
	}
	out := map[int][]*MigDevice{}
	for index, profiles := range geometry {
		if index >= len(s.Devices) {
			return nil, fmt.Errorf("%s: no GPU %d (the profile has %d)", MigEnv, index, len(s.Devices))
		}
		d := s.Devices[index].(*server.Device)
		if _, r := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); r != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: SetMigMode: %v", index, r)
		}
		out[index] = []*MigDevice{}
		for _, name := range profiles {
			info, err := giProfile(d, name)
			if err != nil {
				return nil, err
			}
			gi, r := d.CreateGpuInstance(&info)
			if r != nvml.SUCCESS {
				return nil, fmt.Errorf("GPU %d: CreateGpuInstance %s: %v", index, name, r)
			}
			ciInfo, err := fullComputeProfile(gi, info)
			if err != nil {
				return nil, fmt.Errorf("GPU %d: %s: %v", index, name, err)
			}
			ci, r := gi.CreateComputeInstance(&ciInfo)
			if r != nvml.SUCCESS {
				return nil, fmt.Errorf("GPU %d: CreateComputeInstance %s: %v", index, name, r)
			}
			giInfo, _ := gi.GetInfo()
			cInfo, _ := ci.GetInfo()
			m := &MigDevice{
				Parent:    d,
				Index:     len(out[index]),
				GI:        gi.(*server.GpuInstance),
				CI:        ci.(*server.ComputeInstance),
				GiID:      giInfo.Id,
				CiID:      cInfo.Id,
				Profile:   name,
				Name:      d.Config.Name + " MIG " + name,
				MemoryMB:  info.MemorySizeMB,
				GiProfile: info,
				CiProfile: ciInfo,
			}
			// Fixed per parent and instance, as a driver's MIG UUIDs are while the
			// instance lives: a v5 UUID of the parent's UUID and the GI/CI ids.
			parent := uuid.MustParse(strings.TrimPrefix(d.UUID, "GPU-"))
			m.UUID = "MIG-" + uuid.NewSHA1(parent, fmt.Appendf(nil, "gi%d/ci%d", m.GiID, m.CiID)).String()
			out[index] = append(out[index], m)
		}
	}
	return out, nil
}

// fullComputeProfile is the compute instance profile that spans the whole GPU instance
// (`nvidia-smi mig -cgi ... -C`), shared engines.
func fullComputeProfile(gi nvml.GpuInstance, giInfo nvml.GpuInstanceProfileInfo) (nvml.ComputeInstanceProfileInfo, error) {
	for id := 0; id < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; id++ {
		info, r := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if r == nvml.SUCCESS && info.SliceCount == giInfo.SliceCount {
			return info, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("no compute instance profile of %d slices", giInfo.SliceCount)
}

// MigSpec is the geometry this process serves: MigEnv, else the file `beside` names
// (the bridge's mock-nvml-mig beside the library, for hooks run with an empty
// environment), else none.
func MigSpec(beside string) (string, error) {
	if spec := os.Getenv(MigEnv); spec != "" {
		return spec, nil
	}
	if beside == "" {
		return "", nil
	}
	text, err := os.ReadFile(beside)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(text)), nil
}
