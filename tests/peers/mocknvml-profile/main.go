// Command mocknvml-profile prints what the mock libnvidia-ml serves for a profile, as
// JSON, straight from NVIDIA's mock server: what gpupin's tests compare gpupin's answers
// with. With GPUPIN_MOCK_MIG set, each GPU in MIG mode lists its MIG devices as the
// library serves them (package profile makes them, for both).
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"gpupin/tests/peers/profile"
)

type mig struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	Profile     string `json:"profile"`
	MemoryBytes uint64 `json:"memory_bytes"`
	GI          uint32 `json:"gi"`
	CI          uint32 `json:"ci"`
}

type gpu struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memory_bytes"`
	PciBusID    string `json:"pci_bus_id"`
	Minor       int    `json:"minor"`
	Mig         *[]mig `json:"mig,omitempty"`
}

var migs map[int][]*profile.MigDevice

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintf(os.Stderr, "usage: mocknvml-profile PROFILE (one of %v)\n", profile.Names())
		os.Exit(2)
	}
	s, err := profile.New(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	spec, err := profile.MigSpec("")
	if err == nil {
		var devices map[int][]*profile.MigDevice
		if devices, err = profile.ApplyMig(s, spec); err == nil {
			migs = devices
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := struct {
		Driver string `json:"driver"`
		Nvml   string `json:"nvml"`
		Cuda   int    `json:"cuda"`
		Gpus   []gpu  `json:"gpus"`
	}{s.DriverVersion, s.NvmlVersion, s.CudaDriverVersion, nil}
	for _, d := range s.Devices {
		d := d.(*server.Device)
		g := gpu{d.Index, d.UUID, d.Config.Name, d.MemoryInfo.Total, d.PciBusID, d.Minor, nil}
		if list, ok := migs[d.Index]; ok {
			instances := []mig{}
			for _, m := range list {
				instances = append(instances, mig{m.Index, m.UUID, m.Name, m.Profile, m.MemoryMB << 20, m.GiID, m.CiID})
			}
			g.Mig = &instances
		}
		out.Gpus = append(out.Gpus, g)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		os.Exit(1)
	}
}
